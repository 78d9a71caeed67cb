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

/**
 * Faults injected into WireMock through its own extension point, applied to
 * every request before WireMock answers it from its stubs:
 *
 * <ul>
 *   <li>{@code /hold/...}: takes the shared monitor in a {@code synchronized} block and keeps it
 *       for {@code deepspan.fault.hold_cpu_ms} of this thread's CPU time (busy work, so the holder
 *       runs while the others wait);
 *   <li>{@code /api/...}: takes the same monitor for a moment (a request of the application that
 *       needs a lock another request holds);
 *   <li>{@code /cpu/...}: {@code deepspan.fault.work_cpu_ms} of CPU time, no lock.
 * </ul>
 *
 * <p>The oracle for the test: one JSON line per request in the file named by {@code
 * deepspan.fault.log} with its traceparent, role and kernel thread id. A holder writes its line
 * as soon as it holds the monitor, so the test knows when to send the waiters.
 */
public final class LockFault implements ResponseDefinitionTransformerV2 {
  private static final Object SHARED = new Object();
  private static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();
  private static final long HOLD_CPU_NS = millis("deepspan.fault.hold_cpu_ms", 600) * 1_000_000L;
  private static final long WORK_CPU_NS = millis("deepspan.fault.work_cpu_ms", 30) * 1_000_000L;
  private static final String LOG = System.getProperty("deepspan.fault.log", "fault.jsonl");
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
      synchronized (SHARED) {
        log(traceparent, "holder");
        busy(HOLD_CPU_NS);
      }
    } else if (url.startsWith("/api/")) {
      long waitedFrom = System.nanoTime();
      synchronized (SHARED) {
        log(traceparent, "waiter", System.nanoTime() - waitedFrom);
      }
    } else if (url.startsWith("/cpu/")) {
      busy(WORK_CPU_NS);
      log(traceparent, "cpu");
    }
    return serveEvent.getResponseDefinition();
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

  private static synchronized void log(String traceparent, String role, long waitedNs) {
    String line =
        String.format(
            "{\"traceparent\":\"%s\",\"role\":\"%s\",\"tid\":%d,\"pid\":%d,\"waited_ns\":%d}%n",
            traceparent, role, kernelTid(), ProcessHandle.current().pid(), waitedNs);
    try (FileWriter out = new FileWriter(LOG, true)) {
      out.write(line);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
