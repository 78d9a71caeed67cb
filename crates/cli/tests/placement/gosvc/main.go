// Command gosvc is a small Go HTTP service with stock OpenTelemetry only
// (the SDK, otelhttp and the OTLP/HTTP exporter; nothing of deepspan), for
// the placement test of crates/cli/tests/it/placement_go.rs: its requests
// carry no deepspan fields, so `deepspan analyze` has to place them from
// the kernel trace alone. Goroutines move between OS threads, so the
// process as a whole (`sync: process`) is the expected placement.
//
//	gosvc run   -out DIR [-requests N] [-clients C] [-work K]
//	gosvc serve -out DIR [-requests N] [-work K]
//	gosvc load  -out DIR [-requests N] [-clients C]
//
// `serve` listens on 127.0.0.1 (a free port), writes DIR/server.json
// ({"pid", "port"}) once listening, answers GET /work with K rounds of
// SHA-256 over 64 KiB (fixed CPU work, not a time), one otelhttp SERVER
// span each, and exits after N requests, flushing its spans to
// OTEL_EXPORTER_OTLP_ENDPOINT (what `deepspan record` gives its command).
// Each served request's span id goes to DIR/served.jsonl with the pid.
//
// `load` waits for DIR/server.json and, with -wait-go, for the file DIR/go
// too (the test's go-ahead once it has put the server under a CPU quota),
// then sends N requests from C goroutines, a
// connection each, and exits. `run` starts both as child processes of its
// own (so the test can move the server alone into a cgroup) and waits.
// Every wait is bounded, so a broken test ends instead of hanging.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// How long any stage may wait for another before giving up.
const patience = 120 * time.Second

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: gosvc run|serve|load -out DIR [-requests N] [-clients C] [-work K] [-wait-go]"))
	}
	mode := os.Args[1]
	flags := flag.NewFlagSet(mode, flag.ExitOnError)
	out := flags.String("out", "", "folder for server.json, served.jsonl and the go-ahead file")
	requests := flags.Int("requests", 32, "requests to serve / send")
	clients := flags.Int("clients", 4, "concurrent client goroutines")
	work := flags.Int("work", 200, "SHA-256 rounds over 64 KiB per request")
	waitGo := flags.Bool("wait-go", false, "load: wait for the file OUT/go before sending")
	flags.Parse(os.Args[2:])
	if *out == "" || *requests <= 0 || *clients <= 0 || *work <= 0 {
		fail(errors.New("-out is required; -requests, -clients and -work must be positive"))
	}
	var err error
	switch mode {
	case "run":
		err = run(*out, *requests, *clients, *work, *waitGo)
	case "serve":
		err = serve(*out, *requests, *work)
	case "load":
		err = load(*out, *requests, *clients, *waitGo)
	default:
		err = fmt.Errorf("unknown mode %q (run, serve or load)", mode)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gosvc:", err)
	os.Exit(1)
}

// run starts the server and the load generator as two processes and waits
// for both.
func run(out string, requests, clients, work int, waitGo bool) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	common := []string{"-out", out, "-requests", fmt.Sprint(requests)}
	server := exec.Command(self, append([]string{"serve", "-work", fmt.Sprint(work)}, common...)...)
	loadArgs := append([]string{"load", "-clients", fmt.Sprint(clients)}, common...)
	if waitGo {
		loadArgs = append(loadArgs, "-wait-go")
	}
	client := exec.Command(self, loadArgs...)
	for _, c := range []*exec.Cmd{server, client} {
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			return err
		}
	}
	clientErr := client.Wait()
	if clientErr != nil {
		// The server would wait for requests that never come.
		server.Process.Kill()
	}
	serverErr := server.Wait()
	if clientErr != nil {
		return fmt.Errorf("load: %w", clientErr)
	}
	if serverErr != nil {
		return fmt.Errorf("serve: %w", serverErr)
	}
	return nil
}

// burn does the request's CPU work: `rounds` SHA-256 sums, each over 64 KiB
// that include the previous sum, so none can be skipped.
func burn(rounds int) string {
	block := make([]byte, 64<<10)
	var sum [sha256.Size]byte
	for i := 0; i < rounds; i++ {
		copy(block, sum[:])
		sum = sha256.Sum256(block)
	}
	return hex.EncodeToString(sum[:])
}

func serve(out string, requests, work int) error {
	ctx := context.Background()
	// Endpoint, headers and timeout from the standard OTEL_EXPORTER_OTLP_*
	// variables.
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return err
	}
	res, err := resource.Merge(resource.Default(),
		resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName("gosvc")))
	if err != nil {
		return err
	}
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter, sdktrace.WithBatchTimeout(500*time.Millisecond)),
		sdktrace.WithResource(res))
	otel.SetTracerProvider(provider)

	served, err := os.Create(filepath.Join(out, "served.jsonl"))
	if err != nil {
		return err
	}
	defer served.Close()
	var servedMu sync.Mutex
	var count atomic.Int64
	done := make(chan struct{})
	pid := os.Getpid()

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		digest := burn(work)
		body := fmt.Sprintf("{\"digest\":%q}\n", digest)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		io.WriteString(w, body)
		spanID := trace.SpanFromContext(r.Context()).SpanContext().SpanID().String()
		servedMu.Lock()
		fmt.Fprintf(served, "{\"span_id\":%q,\"pid\":%d}\n", spanID, pid)
		servedMu.Unlock()
		if count.Add(1) == int64(requests) {
			close(done)
		}
	})
	mux := http.NewServeMux()
	mux.Handle("GET /work", handler)
	server := &http.Server{Handler: otelhttp.NewHandler(mux, "GET /work")}

	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := listener.Addr().(*net.TCPAddr).Port
	if err := writeAtomically(filepath.Join(out, "server.json"),
		fmt.Sprintf("{\"pid\":%d,\"port\":%d}\n", pid, port)); err != nil {
		return err
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- server.Serve(listener) }()

	select {
	case <-done:
	case err := <-serveErr:
		return err
	case <-time.After(patience):
		return fmt.Errorf("served %d of %d requests in %v", count.Load(), requests, patience)
	}
	// The last response may still be on its way out: a graceful shutdown
	// waits for it.
	shutdown, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := server.Shutdown(shutdown); err != nil {
		return err
	}
	return provider.Shutdown(shutdown)
}

func writeAtomically(path, text string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// waitFor waits until `path` exists.
func waitFor(path string) error {
	deadline := time.Now().Add(patience)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear in %v", path, patience)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func load(out string, requests, clients int, waitGo bool) error {
	serverFile := filepath.Join(out, "server.json")
	if err := waitFor(serverFile); err != nil {
		return err
	}
	if waitGo {
		if err := waitFor(filepath.Join(out, "go")); err != nil {
			return err
		}
	}
	text, err := os.ReadFile(serverFile)
	if err != nil {
		return err
	}
	var server struct{ Port int }
	if err := json.Unmarshal(text, &server); err != nil {
		return fmt.Errorf("%s: %w", serverFile, err)
	}
	client := &http.Client{
		Timeout:   patience,
		Transport: &http.Transport{DisableKeepAlives: true},
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/work", server.Port)
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for k := 0; k < clients; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			for i := k; i < requests; i += clients {
				resp, err := client.Get(fmt.Sprintf("%s?i=%d", url, i))
				if err != nil {
					errs <- err
					return
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("request %d: %s", i, resp.Status)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(k)
	}
	wg.Wait()
	close(errs)
	return <-errs
}
