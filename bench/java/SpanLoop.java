import io.opentelemetry.api.GlobalOpenTelemetry;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.Tracer;
import io.opentelemetry.context.Scope;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

/**
 * The Java extension benchmark's load (bench/java_extension_bench.py): spans made through the
 * OpenTelemetry API, which the agent bridges to its SDK. Each span is made current once (one
 * activation, as a request's server span) with one child, and ended. Prints, as JSON, the wall
 * and CPU time per span of the best of ROUNDS rounds of SPANS spans each (the first rounds warm the
 * JIT; the best round is the one least disturbed by other load).
 *
 * <p>Usage: java -javaagent:... -cp CLASSES:opentelemetry-api.jar:opentelemetry-context.jar
 * SpanLoop SPANS ROUNDS
 */
public class SpanLoop {
  public static void main(String[] args) {
    int spans = Integer.parseInt(args[0]);
    int rounds = Integer.parseInt(args[1]);
    Tracer tracer = GlobalOpenTelemetry.getTracer("bench");
    ThreadMXBean threads = ManagementFactory.getThreadMXBean();
    double bestWall = Double.MAX_VALUE;
    double bestCpu = Double.MAX_VALUE;
    for (int r = 0; r < rounds; r++) {
      long start = System.nanoTime();
      long cpuStart = threads.getCurrentThreadCpuTime();
      for (int i = 0; i < spans; i++) {
        Span span = tracer.spanBuilder("request").startSpan();
        try (Scope scope = span.makeCurrent()) {
          Span child = tracer.spanBuilder("child").startSpan();
          child.end();
        } finally {
          span.end();
        }
      }
      bestCpu = Math.min(bestCpu, (threads.getCurrentThreadCpuTime() - cpuStart) / (2.0 * spans));
      bestWall = Math.min(bestWall, (System.nanoTime() - start) / (2.0 * spans));
    }
    System.out.printf("{\"wall_ns_per_span\": %.1f, \"cpu_ns_per_span\": %.1f}%n", bestWall, bestCpu);
  }
}
