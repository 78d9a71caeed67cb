package dev.deepspan.otel.dcpt;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/**
 * The wire format of sdk/python's deepspan_otel.dcpt (its module doc is the specification),
 * and the critical calls' walk. crates/cli/tests/it/java_app.rs decodes what WireMock answers
 * with deepspan's own decoder.
 */
class DcptPathTest {
  @Test
  void namesAreEscapedButForUnreservedCharactersAndSlash() {
    assertEquals(
        "GET%20/a%20b%3Ac%3Bd%2Be%2Cf%5Eg%40h%25i~j-k.l_m",
        DcptPath.escape("GET /a b:c;d+e,f^g@h%i~j-k.l_m"));
    assertEquals("caf%C3%A9", DcptPath.escape("café"));
  }

  @Test
  void namesAreCutTo200BytesAtACharacterBoundary() {
    // 150 two-byte characters: 100 fit.
    String cut = DcptPath.escape(String.join("", Collections.nCopies(150, "é")));
    assertEquals(String.join("", Collections.nCopies(100, "%C3%A9")), cut);
    assertEquals(200, DcptPath.escape("x".repeat(500)).length());
  }

  @Test
  void aHopAndItsCallsInTurnAreSiblingsBelowIt() {
    String value =
        DcptPath.encode(
            new DcptPath.Hop("front", "GET /product", 1500, 48000, -1),
            Arrays.asList(
                new DcptPath.Hop("127.0.0.1:8081", "GET /stock", 9500, 9500, 9500),
                new DcptPath.Hop("127.0.0.1:8082", "GET /price", 12000, 12000, 12000)),
            DcptPath.MAX_HEADER_BYTES);
    assertEquals(
        "2;front:GET%20/product:1500:48000;9500@127.0.0.1%3A8081:GET%20/stock:9500:9500;"
            + "1^12000@127.0.0.1%3A8082:GET%20/price:12000:12000",
        value);
  }

  @Test
  void aValueTooLongLosesHopsFromItsEndCountedByAMarker() {
    List<DcptPath.Hop> calls = new ArrayList<>();
    for (int i = 0; i < 40; i++) {
      calls.add(new DcptPath.Hop("callee-" + i + "x".repeat(150), "GET /" + i, 10, 10, 10));
    }
    String value =
        DcptPath.encode(
            new DcptPath.Hop("front", "GET /", 0, 400, -1), calls, DcptPath.MAX_HEADER_BYTES);
    assertTrue(value.length() <= DcptPath.MAX_HEADER_BYTES, value.length() + " bytes");
    List<String> parts = Arrays.asList(value.split(";"));
    String marker = parts.get(parts.size() - 1);
    int kept = parts.size() - 3; // the version, the first hop, the marker
    assertEquals("+" + (40 - kept), marker);
    assertTrue(parts.get(1).startsWith("front:"), value);
    // One more hop would not have fit.
    assertTrue(value.length() + 1 + parts.get(2).length() > DcptPath.MAX_HEADER_BYTES);
  }

  @Test
  void theCriticalCallsAreTheLastReturningWalkBackFromTheReply() {
    // a, then b and c sent together (b waited for), then d, which returned after the reply.
    DcptRequests.Call a = new DcptRequests.Call(0, 10, "a", "GET /a");
    DcptRequests.Call b = new DcptRequests.Call(12, 20, "b", "GET /b");
    DcptRequests.Call c = new DcptRequests.Call(12, 18, "c", "GET /c");
    DcptRequests.Call d = new DcptRequests.Call(21, 30, "d", "GET /d");
    List<DcptRequests.Call> critical = DcptRequests.critical(Arrays.asList(c, d, b, a), 25);
    assertEquals(
        "a b", critical.stream().map(x -> x.callee).collect(Collectors.joining(" ")));
  }

  @Test
  void aRequestsSelfTimeIsItsTotalLessItsCriticalCalls() {
    DcptRequests.Open open = DcptRequests.open("t1", "GET /product", 1_000_000);
    assertTrue(DcptRequests.any());
    DcptRequests.callEnded("t1", 2_000_000, 5_000_000, "127.0.0.1:8081", "GET /stock");
    // Another trace's call is not this request's.
    DcptRequests.callEnded("t2", 2_000_000, 9_000_000, "127.0.0.1:9", "GET /other");
    String value = DcptRequests.close(open, 11_000_000);
    assertTrue(value.startsWith("2;"), value);
    assertTrue(value.endsWith(":GET%20/product:7000:10000;3000@127.0.0.1%3A8081:GET%20/stock:3000:3000"), value);
    assertTrue(!DcptRequests.any(), "a closed request is forgotten");
  }
}
