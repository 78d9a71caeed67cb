package dev.deepspan.otel;

import io.opentelemetry.api.common.Attributes;
import io.opentelemetry.sdk.trace.ReadWriteSpan;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;

/**
 * The deepspan state of one thread: its OS thread id and the spans active on it, outermost first.
 *
 * <p>The tid is read once per thread, from the {@code /proc/thread-self} link ("PID/task/TID"):
 * Java has no gettid, and one readlink per thread is no cost per span. Platform threads only: a
 * virtual thread (JDK 21) would cache the carrier it first ran on.
 *
 * <p>Activations nest like contexts, as in {@code deepspan_otel} (Python): when a child span
 * becomes current its parent's activation stays open, and closes only when the parent's own context
 * goes (or the thread switches to an unrelated context); the span active on a thread is the
 * innermost open one.
 */
final class DeepspanThread {
  private static final Path THREAD_SELF = Paths.get("/proc/thread-self");
  /** The inode of the host's first PID namespace: the kernel gives it a fixed number. */
  private static final long INITIAL_PID_NS = 0xEFFFFFFCL;
  /**
   * The inode of this process's PID namespace when it is not the host's (a container's own), in
   * which the thread ids read here are counted; null in the host's.
   */
  static final Long PID_NAMESPACE = readPidNamespace();
  private static final ThreadLocal<DeepspanThread> CURRENT =
      ThreadLocal.withInitial(() -> new DeepspanThread(readTid()));

  /** The OS thread id, or -1 where /proc/thread-self cannot be read (not Linux). */
  final long tid;

  private final ArrayList<ReadWriteSpan> active = new ArrayList<>(4);

  DeepspanThread(long tid) {
    this.tid = tid;
  }

  static DeepspanThread current() {
    return CURRENT.get();
  }

  /** The kernel's id of the calling thread, from "/proc/thread-self" → "PID/task/TID". */
  static long readTid() {
    try {
      String link = Files.readSymbolicLink(THREAD_SELF).toString();
      return Long.parseLong(link.substring(link.lastIndexOf('/') + 1));
    } catch (IOException | RuntimeException e) {
      return -1;
    }
  }

  /** The inode of /proc/self/ns/pid, unless it is the host's first namespace or unreadable. */
  static Long readPidNamespace() {
    try {
      Object inode = Files.getAttribute(Paths.get("/proc/self/ns/pid"), "unix:ino");
      long ns = ((Number) inode).longValue();
      return ns == INITIAL_PID_NS ? null : ns;
    } catch (IOException | RuntimeException e) {
      return null;
    }
  }

  /**
   * The current span of this thread is now {@code span} (null: none of ours). Records the
   * activations that this changes as span events.
   */
  void switchTo(ReadWriteSpan span) {
    int n = active.size();
    if (n > 0 && active.get(n - 1) == span) {
      return;
    }
    if (span == null && n == 0) {
      return;
    }
    long mono = System.nanoTime();
    if (span == null) {
      closeAbove(0, mono);
      return;
    }
    for (int i = n - 2; i >= 0; i--) {
      if (active.get(i) == span) {
        // Back to an outer context: close what was opened above it.
        closeAbove(i + 1, mono);
        return;
      }
    }
    // A span not open on this thread. The active spans stay a parent → child chain: what is not
    // the new span's parent is closed first (a sibling's or an unrelated request's activation).
    String parentId = span.getParentSpanContext().getSpanId();
    while (!active.isEmpty()
        && !active.get(active.size() - 1).getSpanContext().getSpanId().equals(parentId)) {
      emit(active.remove(active.size() - 1), DeepspanAttributes.EVENT_OFF, mono);
    }
    emit(span, DeepspanAttributes.EVENT_ON, mono);
    active.add(span);
  }

  /** The spans active on this thread, outermost first (a copy, for tests). */
  ArrayList<ReadWriteSpan> active() {
    return new ArrayList<>(active);
  }

  private void closeAbove(int keep, long mono) {
    for (int i = active.size() - 1; i >= keep; i--) {
      emit(active.remove(i), DeepspanAttributes.EVENT_OFF, mono);
    }
  }

  /**
   * Records an activation change of a live span; an ended span is left alone (its end closes every
   * activation). The event's time is the SDK's clock for the span (wall clock anchored on
   * System.nanoTime), the same instant as {@code deepspan.mono_ns}.
   */
  private void emit(ReadWriteSpan span, String name, long mono) {
    if (span.hasEnded()) {
      return;
    }
    span.addEvent(name, Attributes.of(DeepspanAttributes.TID, tid, DeepspanAttributes.MONO_NS, mono));
  }
}
