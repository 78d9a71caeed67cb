import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintWriter;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * A small HTTP server for the Java agent test (crates/cli/tests/it/java_agent.rs): each request of
 * GET /work is taken by a handler thread, which hands the work to a pool thread and waits for it.
 * Uses no OpenTelemetry API: the stock agent instruments it.
 *
 * <p>The server is the test's oracle, not deepspan: per request it appends a JSON line to LOG with
 * the request's traceparent, the kernel thread ids of the handler and of the pool thread (from
 * /proc/thread-self/status, "Pid:" line) and System.nanoTime() read on each.
 *
 * <p>Usage: java PoolServer PORT LOG; it prints "listening" when ready and exits after GET /quit.
 */
public class PoolServer {
  static long kernelTid() throws IOException {
    for (String line : Files.readAllLines(Paths.get("/proc/thread-self/status"))) {
      if (line.startsWith("Pid:")) {
        return Long.parseLong(line.substring(4).trim());
      }
    }
    throw new IOException("no Pid: line in /proc/thread-self/status");
  }

  /** CPU work: about a millisecond, so the pool thread is seen running. */
  static long spin(long rounds) {
    long x = 0x9e3779b97f4a7c15L;
    for (long i = 0; i < rounds; i++) {
      x = Long.rotateLeft(x, 7) ^ i;
      x *= 0xbf58476d1ce4e5b9L;
    }
    return x;
  }

  public static void main(String[] args) throws Exception {
    int port = Integer.parseInt(args[0]);
    PrintWriter log = new PrintWriter(Files.newBufferedWriter(Paths.get(args[1])), true);
    ExecutorService pool = Executors.newFixedThreadPool(2);
    HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 64);
    server.setExecutor(Executors.newFixedThreadPool(2));
    server.createContext(
        "/work",
        (HttpExchange exchange) -> {
          try {
            long handlerTid = kernelTid();
            long handlerMono = System.nanoTime();
            Future<long[]> work =
                pool.submit(
                    () -> {
                      long mono = System.nanoTime();
                      long check = spin(300_000);
                      Thread.sleep(2);
                      return new long[] {kernelTid(), mono, check};
                    });
            long[] done = work.get();
            String traceparent = exchange.getRequestHeaders().getFirst("traceparent");
            String line =
                String.format(
                    "{\"traceparent\":\"%s\",\"handler_tid\":%d,\"handler_mono_ns\":%d,"
                        + "\"worker_tid\":%d,\"worker_mono_ns\":%d,\"check\":%d}",
                    traceparent, handlerTid, handlerMono, done[0], done[1], done[2]);
            synchronized (log) {
              log.println(line);
            }
            byte[] body = line.getBytes(StandardCharsets.UTF_8);
            exchange.sendResponseHeaders(200, body.length);
            try (OutputStream out = exchange.getResponseBody()) {
              out.write(body);
            }
          } catch (Exception e) {
            byte[] body = e.toString().getBytes(StandardCharsets.UTF_8);
            exchange.sendResponseHeaders(500, body.length);
            try (OutputStream out = exchange.getResponseBody()) {
              out.write(body);
            }
          }
        });
    server.createContext(
        "/quit",
        (HttpExchange exchange) -> {
          exchange.sendResponseHeaders(200, -1);
          exchange.close();
          new Thread(
                  () -> {
                    server.stop(0);
                    pool.shutdown();
                    log.close();
                    // The agent exports its last spans in its shutdown hook.
                    System.exit(0);
                  })
              .start();
        });
    server.start();
    System.out.println("listening");
    System.out.flush();
  }
}
