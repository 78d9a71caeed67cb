package dev.deepspan.otel;

import io.opentelemetry.context.ContextStorage;
import io.opentelemetry.sdk.autoconfigure.spi.AutoConfigurationCustomizer;
import io.opentelemetry.sdk.autoconfigure.spi.AutoConfigurationCustomizerProvider;

/**
 * The extension's entry point, found by the agent through {@code META-INF/services}: adds {@link
 * DeepspanSpanProcessor} to the tracer provider and {@link DeepspanContextStorage} around the
 * agent's context storage.
 */
public final class DeepspanCustomizer implements AutoConfigurationCustomizerProvider {
  @Override
  public void customize(AutoConfigurationCustomizer customizer) {
    // A wrapper counts only when added before the storage is first used (later it is ignored,
    // logged by the agent at FINE). The agent runs this while building its SDK, before any
    // application code; crates/cli/tests/it/java_agent.rs checks that activations are recorded.
    ContextStorage.addWrapper(DeepspanContextStorage::new);
    customizer.addTracerProviderCustomizer(
        (builder, config) -> builder.addSpanProcessor(new DeepspanSpanProcessor()));
  }
}
