// A minimal OpenTelemetry Collector for deepspan's tests and benchmarks:
// the OTLP receiver, the batch processor and the OTLP/HTTP exporter, all
// of release v0.165.0 (v1.71.0 for the stable modules). Built from the Go
// module proxy by scripts/build-go.sh; run it with a configuration
// such as config.yaml beside this file:
//
//	otelcol --config deploy/collector/config.yaml
package main

import (
	"log"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/otlphttpexporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/batchprocessor"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	var err error
	factories := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	if factories.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return factories, err
	}
	if factories.Processors, err = otelcol.MakeFactoryMap[processor.Factory](batchprocessor.NewFactory()); err != nil {
		return factories, err
	}
	if factories.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](otlphttpexporter.NewFactory()); err != nil {
		return factories, err
	}
	return factories, nil
}

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol",
			Description: "OpenTelemetry Collector: OTLP in, batch, OTLP/HTTP out",
			Version:     "0.165.0",
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					fileprovider.NewFactory(),
					envprovider.NewFactory(),
				},
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		log.Fatal(err)
	}
}
