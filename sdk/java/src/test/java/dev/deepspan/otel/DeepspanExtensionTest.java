package dev.deepspan.otel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.Tracer;
import io.opentelemetry.context.Context;
import io.opentelemetry.context.ContextStorage;
import io.opentelemetry.context.Scope;
import io.opentelemetry.sdk.testing.exporter.InMemorySpanExporter;
import io.opentelemetry.sdk.trace.SdkTracerProvider;
import io.opentelemetry.sdk.trace.data.EventData;
import io.opentelemetry.sdk.trace.data.SpanData;
import io.opentelemetry.sdk.trace.export.SimpleSpanProcessor;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The processor and the context storage wrapper on a plain SDK, set up as the agent does (wrapper
 * added before the storage is first used, processor on the tracer provider).
 */
class DeepspanExtensionTest {
  static {
    ContextStorage.addWrapper(DeepspanContextStorage::new);
  }

  private final InMemorySpanExporter exporter = InMemorySpanExporter.create();
  private final SdkTracerProvider provider =
      SdkTracerProvider.builder()
          .addSpanProcessor(new DeepspanSpanProcessor())
          .addSpanProcessor(SimpleSpanProcessor.create(exporter))
          .build();
  private final Tracer tracer = provider.get("test");

  @AfterEach
  void close() {
    provider.close();
  }

  /** The kernel's tid of the calling thread, read differently from the extension. */
  static long statusTid() throws IOException {
    for (String line : Files.readAllLines(Paths.get("/proc/thread-self/status"))) {
      if (line.startsWith("Pid:")) {
        return Long.parseLong(line.substring(4).trim());
      }
    }
    throw new IOException("no Pid: line");
  }

  SpanData finished(String name) {
    return exporter.getFinishedSpanItems().stream()
        .filter(s -> s.getName().equals(name))
        .findFirst()
        .orElseThrow();
  }

  /** The span's activations as "on@TID" / "off@TID", in order. */
  static List<String> activations(SpanData span) {
    return span.getEvents().stream()
        .map(e -> e.getName().substring("deepspan.".length()) + "@" + e.getAttributes().get(DeepspanAttributes.TID))
        .collect(Collectors.toList());
  }

  @Test
  void spansCarryTheKernelTidAndMonotonicTimes() throws Exception {
    long before = System.nanoTime();
    Span span = tracer.spanBuilder("request").startSpan();
    Thread.sleep(2);
    span.end();
    long after = System.nanoTime();
    SpanData data = finished("request");
    assertEquals(statusTid(), data.getAttributes().get(DeepspanAttributes.TID));
    // The tests run in the host's PID namespace, whose ids are the kernel's.
    assertEquals(null, data.getAttributes().get(DeepspanAttributes.PID_NS));
    long start = data.getAttributes().get(DeepspanAttributes.MONO_START);
    long end = data.getAttributes().get(DeepspanAttributes.MONO_END);
    assertTrue(before <= start && start + 2_000_000 <= end && end <= after, start + " " + end);
    // No activation: the span was never current.
    assertEquals(List.of(), data.getEvents());
  }

  @Test
  void activationsNestLikeContexts() throws Exception {
    long tid = statusTid();
    Span parent = tracer.spanBuilder("parent").startSpan();
    try (Scope p = parent.makeCurrent()) {
      Span child = tracer.spanBuilder("child").startSpan();
      try (Scope c = child.makeCurrent()) {
        // Making the same context current again changes nothing.
        try (Scope again = Context.current().makeCurrent()) {}
      }
      child.end();
    }
    parent.end();
    assertEquals(List.of("on@" + tid, "off@" + tid), activations(finished("parent")));
    assertEquals(List.of("on@" + tid, "off@" + tid), activations(finished("child")));
    // The parent is opened before and closed after the child.
    EventData parentOn = finished("parent").getEvents().get(0);
    EventData childOn = finished("child").getEvents().get(0);
    assertTrue(
        parentOn.getAttributes().get(DeepspanAttributes.MONO_NS)
            <= childOn.getAttributes().get(DeepspanAttributes.MONO_NS));
  }

  @Test
  void aRequestHandedToAPoolThreadIsFollowed() throws Exception {
    long tid = statusTid();
    ExecutorService pool = Executors.newSingleThreadExecutor();
    long[] poolTid = new long[1];
    Span request = tracer.spanBuilder("request").startSpan();
    try (Scope s = request.makeCurrent()) {
      // What the agent's executor instrumentation does: the task runs in the submitter's context.
      pool.submit(Context.current().wrap(() -> poolTid[0] = DeepspanThread.readTid())).get();
    } finally {
      request.end();
      pool.shutdown();
    }
    assertNotEquals(tid, poolTid[0]);
    assertEquals(
        List.of("on@" + tid, "on@" + poolTid[0], "off@" + poolTid[0], "off@" + tid),
        activations(finished("request")));
  }

  @Test
  void anUnrelatedContextClosesTheActivationsOfTheThread() throws Exception {
    long tid = statusTid();
    Span first = tracer.spanBuilder("first").startSpan();
    Span second = tracer.spanBuilder("second").setNoParent().startSpan();
    Scope one = first.makeCurrent();
    // A context not made from the current one (another request's), attached on top.
    try (Scope two = Context.root().with(second).makeCurrent()) {
      assertEquals(List.of(second), List.copyOf(DeepspanThread.current().active()));
    }
    one.close();
    first.end();
    second.end();
    assertEquals(List.of("on@" + tid, "off@" + tid, "on@" + tid, "off@" + tid), activations(finished("first")));
    assertEquals(List.of("on@" + tid, "off@" + tid), activations(finished("second")));
    assertTrue(DeepspanThread.current().active().isEmpty());
  }

  @Test
  void anEndedSpanGetsNoMoreEvents() throws Exception {
    Span span = tracer.spanBuilder("request").startSpan();
    Scope scope = span.makeCurrent();
    span.end();
    scope.close();
    assertEquals(List.of("on@" + statusTid()), activations(finished("request")));
    assertTrue(DeepspanThread.current().active().isEmpty());
  }

  /**
   * System.nanoTime() is CLOCK_MONOTONIC on Linux: OpenJDK's os::javaTimeNanos calls
   * clock_gettime(CLOCK_MONOTONIC) (src/hotspot/os/posix/os_posix.cpp). Checked here too: a
   * CLOCK_MONOTONIC reading by another program lies between two nanoTime readings around it. An
   * offset clock (CLOCK_BOOTTIME after a suspend, CLOCK_REALTIME, a JVM-relative origin) fails.
   */
  @Test
  void nanoTimeIsClockMonotonic() throws Exception {
    for (int round = 0; round < 3; round++) {
      long before = System.nanoTime();
      Process python =
          new ProcessBuilder(
                  "python3",
                  "-c",
                  "import time; print(time.clock_gettime_ns(time.CLOCK_MONOTONIC))")
              .redirectErrorStream(true)
              .start();
      String out = new String(python.getInputStream().readAllBytes(), StandardCharsets.UTF_8).trim();
      assertEquals(0, python.waitFor(), out);
      long after = System.nanoTime();
      long monotonic = Long.parseLong(out);
      assertTrue(before < monotonic && monotonic < after, before + " < " + monotonic + " < " + after);
    }
  }
}
