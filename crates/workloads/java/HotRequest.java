import java.nio.file.*;

/**
 * One CPU-bound request in Java for the CPU-profile tests: a hot method, a
 * sleep, the hot method again, written as an OTLP JSON span with deepspan's
 * thread id and monotonic times (System.nanoTime is CLOCK_MONOTONIC on
 * Linux). Usage: java HotRequest ROUNDS SPANS.json
 */
public class HotRequest {
    static long spinHot(long rounds) {
        long x = 0x9e3779b97f4a7c15L;
        for (long i = 0; i < rounds; i++) {
            x = Long.rotateLeft(x, 7) ^ i;
            x *= 0xbf58476d1ce4e5b9L;
        }
        return x;
    }

    public static void main(String[] args) throws Exception {
        long rounds = Long.parseLong(args[0]);
        long wallStart = System.currentTimeMillis() * 1_000_000L;
        long monoStart = System.nanoTime();
        long a = spinHot(rounds);
        Thread.sleep(50);
        long b = spinHot(rounds);
        long monoEnd = System.nanoTime();
        long wallEnd = wallStart + (monoEnd - monoStart);
        // /proc/thread-self -> "PID/task/TID"
        String self = Files.readSymbolicLink(Paths.get("/proc/thread-self")).toString();
        long tid = Long.parseLong(self.substring(self.lastIndexOf('/') + 1));
        String spanId = String.format("%016x", monoStart ^ 0x5a5a);
        String traceId = String.format("%016x%016x", monoStart, ProcessHandle.current().pid());
        String attr = "{\"key\":\"%s\",\"value\":{\"intValue\":\"%d\"}}";
        String span = "{\"resourceSpans\":[{\"resource\":{\"attributes\":[{\"key\":\"service.name\",\"value\":{\"stringValue\":\"java-hot\"}}]},"
            + "\"scopeSpans\":[{\"spans\":[{\"traceId\":\"" + traceId + "\",\"spanId\":\"" + spanId + "\",\"name\":\"GET /hot\",\"kind\":2,"
            + "\"startTimeUnixNano\":\"" + wallStart + "\",\"endTimeUnixNano\":\"" + wallEnd + "\",\"attributes\":["
            + String.format(attr, "deepspan.tid", tid) + "," + String.format(attr, "deepspan.mono_start_ns", monoStart) + ","
            + String.format(attr, "deepspan.mono_end_ns", monoEnd) + "]}]}]}]}\n";
        Files.writeString(Paths.get(args[1]), span);
        System.out.println("{\"workload\":\"java-hot\",\"span_id\":\"" + spanId + "\",\"tid\":" + tid
            + ",\"hot_function\":\"HotRequest.spinHot\",\"check\":" + (a ^ b) + "}");
    }
}
