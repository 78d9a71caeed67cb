package dev.deepspan.otel.dcpt;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;

/**
 * The requests of this JVM whose caller asked for their in-band path, until their reply headers
 * go out, with the calls they made meanwhile (the client spans that ended in their trace).
 *
 * <p>The same rules as {@code deepspan_otel.dcpt}:
 *
 * <ul>
 *   <li>a hop's total is from its request's start to its reply headers;
 *   <li>its critical calls, walking back from the reply: the call that returned last, then the
 *       call that returned last before that one was sent, and so on (the last-returning-child walk
 *       of Jaeger's critical path). Calls made in turn are all on it; of calls made together, the
 *       one waited for;
 *   <li>self time is the total minus the critical calls' durations.
 * </ul>
 *
 * <p>A Java hop does not relay its callees' own paths (the client instrumentations keep their
 * reply headers): each critical call is a hop of its own, named by the address it called, whose
 * self and total are the time the caller waited, as the Python side writes a callee that answered
 * without a path. Times are System.nanoTime (CLOCK_MONOTONIC), the spans' {@code
 * deepspan.mono_*_ns}.
 */
public final class DcptRequests {
  /** Open requests by trace id; more than one when a trace comes back to this JVM. */
  private static final Map<String, List<Open>> OPEN = new ConcurrentHashMap<>();
  /** More open requests than this and those older than {@link #STALE_NS} are dropped. */
  private static final int MAX_OPEN = 4096;

  private static final long STALE_NS = 60_000_000_000L;

  /** The service.name of this JVM's spans, from the first span the processor saw. */
  private static volatile String serviceName = "unknown_service:java";

  private DcptRequests() {}

  /** A request whose path goes out with its reply headers. */
  public static final class Open {
    final String traceId;
    final String operation;
    final long startNs;
    private final List<Call> calls = new ArrayList<>();

    Open(String traceId, String operation, long startNs) {
      this.traceId = traceId;
      this.operation = operation;
      this.startNs = startNs;
    }
  }

  /** A call the request made: when, and the hop that names its callee. */
  static final class Call {
    final long startNs;
    final long endNs;
    final String callee;
    final String operation;

    Call(long startNs, long endNs, String callee, String operation) {
      this.startNs = startNs;
      this.endNs = endNs;
      this.callee = callee;
      this.operation = operation;
    }
  }

  /** Names this JVM's hops; the span processor sets it from the spans' resource. */
  public static void serviceName(String name) {
    if (name != null && !name.isEmpty()) {
      serviceName = name;
    }
  }

  /** Starts following a request of {@code traceId}, begun at {@code startNs}. */
  public static Open open(String traceId, String operation, long startNs) {
    if (OPEN.size() >= MAX_OPEN) {
      // Requests whose reply never went through a hook (a connection reset before it): forget
      // them rather than grow.
      OPEN.values().removeIf(l -> l.stream().allMatch(o -> startNs - o.startNs > STALE_NS));
    }
    Open open = new Open(traceId, operation, startNs);
    OPEN.computeIfAbsent(traceId, t -> new CopyOnWriteArrayList<>()).add(open);
    return open;
  }

  /** True when some request is followed: the span processor's fast path. */
  public static boolean any() {
    return !OPEN.isEmpty();
  }

  /**
   * A client call of {@code traceId} ended: it belongs to the open request of that trace that
   * started last before it.
   */
  public static void callEnded(
      String traceId, long startNs, long endNs, String callee, String operation) {
    List<Open> open = OPEN.get(traceId);
    if (open == null) {
      return;
    }
    Open owner = null;
    for (Open o : open) {
      if (o.startNs <= startNs && (owner == null || o.startNs > owner.startNs)) {
        owner = o;
      }
    }
    if (owner != null) {
      synchronized (owner.calls) {
        owner.calls.add(new Call(startNs, endNs, callee, operation));
      }
    }
  }

  /** The request's path as its reply headers go out at {@code replyNs}; it is forgotten. */
  public static String close(Open request, long replyNs) {
    OPEN.computeIfPresent(
        request.traceId,
        (t, l) -> {
          l.remove(request);
          return l.isEmpty() ? null : l;
        });
    List<Call> calls;
    synchronized (request.calls) {
      calls = new ArrayList<>(request.calls);
    }
    List<DcptPath.Hop> critical = new ArrayList<>();
    long waited = 0;
    for (Call c : critical(calls, replyNs)) {
      long us = (c.endNs - c.startNs) / 1000;
      waited += us;
      critical.add(new DcptPath.Hop(c.callee, c.operation, us, us, us));
    }
    long totalUs = (replyNs - request.startNs) / 1000;
    DcptPath.Hop own =
        new DcptPath.Hop(serviceName, request.operation, totalUs - waited, totalUs, -1);
    return DcptPath.encode(own, critical, DcptPath.MAX_HEADER_BYTES);
  }

  /** The critical calls of those ended by {@code replyNs}, in the order they were made. */
  static List<Call> critical(List<Call> calls, long replyNs) {
    List<Call> byEnd = new ArrayList<>(calls);
    byEnd.sort(Comparator.comparingLong((Call c) -> c.endNs).reversed());
    List<Call> walk = new ArrayList<>();
    long cursor = replyNs;
    for (Call c : byEnd) {
      if (c.endNs <= cursor) {
        walk.add(c);
        cursor = c.startNs;
      }
    }
    java.util.Collections.reverse(walk);
    return walk;
  }
}
