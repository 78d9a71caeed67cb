package deepspan.fault;

import com.github.tomakehurst.wiremock.extension.ResponseDefinitionTransformerV2;
import com.github.tomakehurst.wiremock.http.Request;
import com.github.tomakehurst.wiremock.http.ResponseDefinition;
import com.github.tomakehurst.wiremock.stubbing.ServeEvent;
import java.io.FileWriter;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Faults injected into WireMock through its own extension point, applied to
 * every request before WireMock answers it from its stubs:
 *
 * <ul>
 *   <li>{@code /hold/ROUND/N}: takes the shared monitor in a {@code synchronized} block, waits
 *       (spinning) until N waiters are blocked on it, then keeps it for {@code
 *       deepspan.fault.hold_cpu_ms} more of this thread's CPU time (busy work, so the holder runs
 *       while the others wait). Waiting for the waiters makes every one of them wait, however
 *       late a loaded machine runs the client that sends them;
 *   <li>{@code /api/...}: takes the same monitor for a moment (a request of the application that
 *       needs a lock another request holds);
 *   <li>{@code /cpu/...}: {@code deepspan.fault.work_cpu_ms} of CPU time, no lock;
 *   <li>{@code /sleep/...}: {@code deepspan.fault.sleep_ms} asleep on its pool thread (a request
 *       that waits on something slow and keeps its worker while it does).
 * </ul>
 *
 * <p>The oracle for the test: one JSON line per request in the file named by {@code
 * deepspan.fault.log} with its traceparent, role and kernel thread id. A holder writes its line
 * as soon as it holds the monitor, so the test knows when to send the waiters. A sleeper's line
 * also says when it began and ended, on {@code System.nanoTime()} (CLOCK_MONOTONIC, the trace's
 * clock).
 */
public final class LockFault implements ResponseDefinitionTransformerV2 {
  private static final Object SHARED = new Object();
  private static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();
  private static final long HOLD_CPU_NS = millis("deepspan.fault.hold_cpu_ms", 600) * 1_000_000L;
  private static final long WORK_CPU_NS = millis("deepspan.fault.work_cpu_ms", 30) * 1_000_000L;
  private static final long SLEEP_MS = millis("deepspan.fault.sleep_ms", 20);
  private static final String LOG = System.getProperty("deepspan.fault.log", "fault.jsonl");
  /** How long a holder waits for its waiters before it gives up on them and holds anyway. */
  private static final long WAITERS_DEADLINE_NS = 60_000_000_000L;
  /** The threads of /api requests that are about to take, or wait for, the shared monitor. */
  private static final Set<Thread> WANTING = ConcurrentHashMap.newKeySet();
  /** Keeps the busy loops' results alive, so the JIT cannot drop them. */
  private static volatile long sink;

  private static long millis(String property, long otherwise) {
    return Long.parseLong(System.getProperty(property, Long.toString(otherwise)));
  }

  @Override
  public String getName() {
    return "deepspan-lock-fault";
  }

  @Override
  public ResponseDefinition transform(ServeEvent serveEvent) {
    Request request = serveEvent.getRequest();
    String url = request.getUrl();
    String traceparent = request.getHeader("traceparent");
    if (url.startsWith("/hold/")) {
      int waiters = waitersOf(url);
      synchronized (SHARED) {
        log(traceparent, "holder");
        awaitBlocked(waiters);
        busy(HOLD_CPU_NS);
      }
    } else if (url.startsWith("/api/")) {
      Thread self = Thread.currentThread();
      WANTING.add(self);
      long waitedFrom = System.nanoTime();
      try {
        synchronized (SHARED) {
          log(traceparent, "waiter", System.nanoTime() - waitedFrom);
        }
      } finally {
        WANTING.remove(self);
      }
    } else if (url.startsWith("/cpu/")) {
      busy(WORK_CPU_NS);
      log(traceparent, "cpu");
    } else if (url.startsWith("/sleep/")) {
      long began = System.nanoTime();
      try {
        Thread.sleep(SLEEP_MS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      log(traceparent, "sleep", 0, began, System.nanoTime());
    }
    return serveEvent.getResponseDefinition();
  }

  /** The N of {@code /hold/ROUND/N}; 0 when the path has no such part. */
  private static int waitersOf(String url) {
    String[] parts = url.split("[/?]");
    // "", "hold", ROUND, N
    if (parts.length < 4) {
      return 0;
    }
    try {
      return Integer.parseInt(parts[3]);
    } catch (NumberFormatException e) {
      return 0;
    }
  }

  /**
   * Spins, holding the monitor, until {@code waiters} threads of /api requests are BLOCKED: the
   * only monitor such a thread takes after it is in {@link #WANTING} is the shared one. Spins
   * rather than sleeps, so the holder stays the thread that runs while they wait.
   */
  private static void awaitBlocked(int waiters) {
    long deadline = System.nanoTime() + WAITERS_DEADLINE_NS;
    long x = 1;
    while (System.nanoTime() < deadline) {
      int blocked = 0;
      for (Thread t : WANTING) {
        if (t.getState() == Thread.State.BLOCKED) {
          blocked++;
        }
      }
      if (blocked >= waiters) {
        break;
      }
      for (int i = 0; i < 10_000; i++) {
        x = x * 6364136223846793005L + 1442695040888963407L;
      }
    }
    sink = x;
  }

  /** Spins until this thread has used {@code cpuNs} of CPU time. */
  private static void busy(long cpuNs) {
    long until = THREADS.getCurrentThreadCpuTime() + cpuNs;
    long x = 1;
    while (THREADS.getCurrentThreadCpuTime() < until) {
      for (int i = 0; i < 10_000; i++) {
        x = x * 6364136223846793005L + 1442695040888963407L;
      }
    }
    sink = x;
  }

  /** The kernel's id of this thread: the last part of /proc/thread-self. */
  private static long kernelTid() {
    try {
      return Long.parseLong(
          Files.readSymbolicLink(Paths.get("/proc/thread-self")).getFileName().toString());
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static void log(String traceparent, String role) {
    log(traceparent, role, 0);
  }

  private static void log(String traceparent, String role, long waitedNs) {
    log(traceparent, role, waitedNs, 0, 0);
  }

  private static synchronized void log(
      String traceparent, String role, long waitedNs, long beganNs, long endedNs) {
    String line =
        String.format(
            "{\"traceparent\":\"%s\",\"role\":\"%s\",\"tid\":%d,\"pid\":%d,\"waited_ns\":%d,"
                + "\"began_ns\":%d,\"ended_ns\":%d}%n",
            traceparent,
            role,
            kernelTid(),
            ProcessHandle.current().pid(),
            waitedNs,
            beganNs,
            endedNs);
    try (FileWriter out = new FileWriter(LOG, true)) {
      out.write(line);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
