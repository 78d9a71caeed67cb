// A Node.js HTTP server (node:http) with stock OpenTelemetry (sdk-node, the
// HTTP instrumentation, the OTLP/HTTP protobuf exporter) and deepspan's span
// processor (sdk/node), for the CLI's placement test:
//
//     node node_server.js OUT [REQUESTS] [CLIENTS]
//
// Serves on 127.0.0.1; each request does some CPU work on the event loop,
// waits 2 ms on a timer (other requests run meanwhile), and answers. A
// client process sends REQUESTS requests from CLIENTS concurrent loops. The
// spans go to OTEL_EXPORTER_OTLP_ENDPOINT (what `deepspan record` gives its
// command). OUT/server.json says which process served (its pid is the event
// loop thread's tid).
'use strict';

const path = require('node:path');
const fs = require('node:fs');
const { createRequire } = require('node:module');

// The OpenTelemetry packages and the processor come from sdk/node.
const sdkDir = path.resolve(__dirname, '../../../../sdk/node');
const sdkRequire = createRequire(path.join(sdkDir, 'package.json'));
const { NodeSDK } = sdkRequire('@opentelemetry/sdk-node');
const { BatchSpanProcessor } = sdkRequire('@opentelemetry/sdk-trace');
const { OTLPTraceExporter } = sdkRequire('@opentelemetry/exporter-trace-otlp-proto');
const { HttpInstrumentation } = sdkRequire('@opentelemetry/instrumentation-http');
const { DeepspanSpanProcessor } = sdkRequire(sdkDir);

const [out, requestsArg, clientsArg] = process.argv.slice(2);
if (!out) {
  console.error('usage: node node_server.js OUT [REQUESTS] [CLIENTS]');
  process.exit(2);
}
const requests = Number(requestsArg ?? 80);
const clients = Number(clientsArg ?? 4);

const sdk = new NodeSDK({
  serviceName: 'node-http',
  spanProcessors: [
    new DeepspanSpanProcessor(),
    new BatchSpanProcessor({ exporter: new OTLPTraceExporter(), scheduledDelayMillis: 500 }),
  ],
  instrumentations: [new HttpInstrumentation()],
});
sdk.start();

// Required after the SDK started: the instrumentation patches it on load.
const http = require('node:http');
const crypto = require('node:crypto');
const { spawn } = require('node:child_process');

const CLIENT = `
const http = require('node:http');
const [port, n, clients] = process.argv.slice(1).map(Number);
let next = 0;
function one() {
  if (next >= n) return Promise.resolve();
  const i = next++;
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: '/work?i=' + i, agent: false }, (res) => {
      res.resume();
      res.on('end', resolve);
    }).on('error', reject);
  }).then(one);
}
Promise.all(Array.from({ length: clients }, one)).then(
  () => process.exit(0),
  (e) => { console.error(e); process.exit(1); },
);
`;

const server = http.createServer((req, res) => {
  const digest = crypto.createHash('sha256').update(Buffer.alloc(200_000, 'x')).digest('hex');
  setTimeout(() => {
    const body = JSON.stringify({ digest });
    res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) });
    res.end(body);
  }, 2);
});

server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  const client = spawn(process.execPath, ['-e', CLIENT, String(port), String(requests), String(clients)], {
    stdio: 'inherit',
  });
  client.on('exit', async (code) => {
    server.close();
    await sdk.shutdown();
    fs.writeFileSync(path.join(out, 'server.json'), JSON.stringify({ pid: process.pid, requests }));
    process.exit(code ?? 1);
  });
});
