// A Node.js HTTP server (node:http) with stock OpenTelemetry (sdk-node, the
// HTTP instrumentation, the OTLP/HTTP protobuf exporter) and deepspan's
// span processor (sdk/node), whose event loop is blocked now and then, for
// the CLI's queue-time test:
//
//     node node_blocked.js OUT [CLIENTS] [BLOCKS] [BLOCK_MS]
//
// Serves on 127.0.0.1. `GET /fast?i=N` hashes 20 KB and answers at once;
// `GET /slow?i=N` burns BLOCK_MS of CPU on the event loop before it
// answers, so every request that arrives meanwhile waits in its socket.
// A client process sends BLOCKS slow requests, 100 ms apart, from one
// loop, and fast ones from CLIENTS concurrent loops (a new connection
// each, 5 ms apart) until the slow ones are done: each loop has one fast
// request in flight when a block begins. The spans go to OTEL_EXPORTER_OTLP_ENDPOINT (what
// `deepspan record` gives its command).
//
// What the test's oracle is, all on CLOCK_MONOTONIC
// (`process.hrtime.bigint()` on Linux, the kernel trace's clock):
// - OUT/server.json: the server's pid, and for each request its id, path
//   and server span id (the span the instrumentation made current in the
//   handler);
// - OUT/clients.json: for each request its id, path, and when the client
//   called and got the whole answer.
'use strict';

const path = require('node:path');
const fs = require('node:fs');
const { createRequire } = require('node:module');

const sdkDir = path.resolve(__dirname, '../../../../sdk/node');
const sdkRequire = createRequire(path.join(sdkDir, 'package.json'));
const { NodeSDK } = sdkRequire('@opentelemetry/sdk-node');
const { BatchSpanProcessor } = sdkRequire('@opentelemetry/sdk-trace');
const { OTLPTraceExporter } = sdkRequire('@opentelemetry/exporter-trace-otlp-proto');
const { HttpInstrumentation } = sdkRequire('@opentelemetry/instrumentation-http');
const { DeepspanSpanProcessor } = sdkRequire(sdkDir);
const api = sdkRequire('@opentelemetry/api');

const [out, clientsArg, blocksArg, blockMsArg] = process.argv.slice(2);
if (!out) {
  console.error('usage: node node_blocked.js OUT [CLIENTS] [BLOCKS] [BLOCK_MS]');
  process.exit(2);
}
const clients = Number(clientsArg ?? 4);
const blocks = Number(blocksArg ?? 5);
const blockMs = Number(blockMsArg ?? 150);

const sdk = new NodeSDK({
  serviceName: 'node-blocked',
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
const fs = require('node:fs');
const [port, clients, blocks] = process.argv.slice(1, 4).map(Number);
const outFile = process.argv[4];
const done = [];
function get(path, i) {
  const sent = process.hrtime.bigint();
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: path + '?i=' + i, agent: false }, (res) => {
      res.resume();
      res.on('end', () => {
        done.push({ i, path, sent_ns: String(sent), done_ns: String(process.hrtime.bigint()) });
        resolve();
      });
    }).on('error', reject);
  });
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let next = 0;
let slowDone = false;
async function fastLoop() {
  while (!slowDone) {
    await get('/fast', next++);
    await sleep(5);
  }
}
async function slowLoop() {
  for (let b = 0; b < blocks; b++) {
    await sleep(100);
    await get('/slow', 1_000_000 + b);
  }
  slowDone = true;
}
Promise.all([...Array.from({ length: clients }, fastLoop), slowLoop()]).then(
  () => { fs.writeFileSync(outFile, JSON.stringify(done)); process.exit(0); },
  (e) => { console.error(e); process.exit(1); },
);
`;

const served = [];
const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://localhost');
  const span = api.trace.getActiveSpan();
  served.push({
    i: Number(url.searchParams.get('i')),
    path: url.pathname,
    span_id: span ? span.spanContext().spanId : null,
  });
  if (url.pathname === '/slow') {
    const until = process.hrtime.bigint() + BigInt(blockMs) * 1_000_000n;
    while (process.hrtime.bigint() < until) {
      crypto.createHash('sha256').update('x').digest();
    }
  } else {
    crypto.createHash('sha256').update(Buffer.alloc(20_000, 'x')).digest();
  }
  res.writeHead(200, { 'Content-Type': 'text/plain' });
  res.end('ok');
});

server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  const args = ['-e', CLIENT, String(port), String(clients), String(blocks),
    path.join(out, 'clients.json')];
  const client = spawn(process.execPath, args, { stdio: 'inherit' });
  client.on('exit', async (code) => {
    server.close();
    fs.writeFileSync(path.join(out, 'server.json'), JSON.stringify({ pid: process.pid, served }));
    try {
      await sdk.shutdown();
    } catch (e) {
      console.error('the spans could not be exported:', e.message);
      process.exit(1);
    }
    process.exit(code ?? 1);
  });
});
