package dev.deepspan.otel.dcpt;

import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharsetEncoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * The in-band critical path's wire format (DCPT: Lopez et al., a Stanford report), version 2: the
 * {@code deepspan-dcpt-path} reply header that {@code sdk/python}'s {@code deepspan_otel.dcpt}
 * writes and relays, and {@code deepspan dcpt decode} reads. That module's doc is the
 * specification; this class writes what a Java hop needs of it: its own hop and the calls on its
 * critical path, each a hop with no calls below it.
 *
 * <pre>
 * value = "2" *( ";" hop ) [ ";+" dropped ]
 * hop   = [ up "^" ] [ call_us "@" ] service ":" operation ":" self_us ":" total_us
 * </pre>
 *
 * <p>Names are UTF-8, cut to 200 bytes at a character boundary, then percent-encoded but for the
 * RFC 3986 unreserved characters and {@code /}, so {@code : ; + , ^ @ %} never appear raw. A value
 * longer than 4096 bytes loses hops from its end, counted by {@code +N}; the first hop stays.
 */
public final class DcptPath {
  /** The opt-in header a caller sends (value {@code 1}) to get the path in the reply. */
  public static final String REQUEST_HEADER = "deepspan-dcpt";
  /** The reply header that carries the encoded path. */
  public static final String REPLY_HEADER = "deepspan-dcpt-path";
  /** The version written. */
  static final String VERSION = "2";
  /** Bound of an encoded value, in bytes. */
  public static final int MAX_HEADER_BYTES = 4096;
  /** Names are cut to this many UTF-8 bytes. */
  static final int MAX_NAME_BYTES = 200;

  /** One service on the path, times in µs. */
  public static final class Hop {
    final String service;
    final String operation;
    final long selfUs;
    final long totalUs;
    /** How long the caller waited for this call; negative for the first hop (not a call). */
    final long callUs;

    public Hop(String service, String operation, long selfUs, long totalUs, long callUs) {
      this.service = service;
      this.operation = operation;
      this.selfUs = Math.max(0, selfUs);
      this.totalUs = Math.max(0, totalUs);
      this.callUs = callUs;
    }
  }

  private DcptPath() {}

  /**
   * The header value of {@code own} followed by {@code calls} (its critical calls in the order
   * made: siblings one level below it), cut from the end to fit {@code limit} bytes.
   */
  public static String encode(Hop own, List<Hop> calls, int limit) {
    List<String> hops = new ArrayList<>(1 + calls.size());
    hops.add(hop(own, false));
    for (int i = 0; i < calls.size(); i++) {
      hops.add(hop(calls.get(i), i > 0));
    }
    // The text is ASCII once escaped: its length in chars is its length in bytes.
    int length = VERSION.length();
    for (String h : hops) {
      length += 1 + h.length();
    }
    int kept = hops.size();
    int dropped = 0;
    while (kept > 1 && length + marker(dropped) > limit) {
      kept--;
      dropped++;
      length -= 1 + hops.get(kept).length();
    }
    StringBuilder out = new StringBuilder(length + marker(dropped));
    out.append(VERSION);
    for (String h : hops.subList(0, kept)) {
      out.append(';').append(h);
    }
    if (dropped > 0) {
      out.append(";+").append(dropped);
    }
    return out.toString();
  }

  private static int marker(int dropped) {
    return dropped == 0 ? 0 : 2 + Integer.toString(dropped).length();
  }

  private static String hop(Hop hop, boolean sibling) {
    StringBuilder out = new StringBuilder();
    if (sibling) {
      // One level up from the previous hop's depth plus one: the previous call's sibling.
      out.append("1^");
    }
    if (hop.callUs >= 0) {
      out.append(hop.callUs).append('@');
    }
    return out.append(escape(hop.service))
        .append(':')
        .append(escape(hop.operation))
        .append(':')
        .append(hop.selfUs)
        .append(':')
        .append(hop.totalUs)
        .toString();
  }

  /** {@code name} cut to {@link #MAX_NAME_BYTES} UTF-8 bytes and percent-encoded. */
  static String escape(String name) {
    byte[] bytes = cut(name);
    StringBuilder out = new StringBuilder(bytes.length);
    for (byte b : bytes) {
      int c = b & 0xff;
      if ((c >= 'A' && c <= 'Z')
          || (c >= 'a' && c <= 'z')
          || (c >= '0' && c <= '9')
          || c == '-'
          || c == '.'
          || c == '_'
          || c == '~'
          || c == '/') {
        out.append((char) c);
      } else {
        out.append('%').append(Character.toUpperCase(Character.forDigit(c >> 4, 16)));
        out.append(Character.toUpperCase(Character.forDigit(c & 0xf, 16)));
      }
    }
    return out.toString();
  }

  /** UTF-8 of {@code name} (lone surrogates as '?'), at most MAX_NAME_BYTES, whole characters. */
  private static byte[] cut(String name) {
    CharsetEncoder encoder =
        StandardCharsets.UTF_8
            .newEncoder()
            .onMalformedInput(CodingErrorAction.REPLACE)
            .onUnmappableCharacter(CodingErrorAction.REPLACE);
    ByteBuffer out = ByteBuffer.allocate(MAX_NAME_BYTES);
    // An encoder stops before a character that does not fit whole.
    encoder.encode(CharBuffer.wrap(name), out, true);
    byte[] bytes = new byte[out.position()];
    out.flip();
    out.get(bytes);
    return bytes;
  }
}
