#!/usr/bin/env node
// Load benchmark of `m40-llm serve`: streaming clients on loopback, with no
// npm packages (Node's fetch). For 1, 8 and 32 concurrent clients it prints
// aggregate generated tokens/s, time to first token (TTFT) and inter-token
// latency (ITL) p50/p99; then one 2,000-token prompt arrives while 8 streams
// run, and their ITL p99 before vs during that prompt shows what chunked
// prefill (--prefill-chunk) and its pacing (--prefill-slowdown) buy.
//
//   node bench/server_load.mjs --model ../shared/models/TinyStories-656K-Q8_0.gguf [--cpu]
//   node bench/server_load.mjs --url http://127.0.0.1:11434 --model-name NAME   # a running server
//
// Options: --binary build/m40-llm, --tokens 128 (per request), --requests 2
// (per client), --threads N, --prefill-chunk N, --prefill-slowdown FACTOR,
// --long-prompt 2000.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

function parseArgs(argv) {
  const o = { binary: path.join(root, 'build', 'm40-llm'), tokens: 128, requests: 2, longPrompt: 2000, cpu: false,
              levels: [1, 8, 32] };
  for (let i = 2; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, '');
    if (key === 'cpu') { o.cpu = true; continue; }
    const value = argv[++i];
    if (value === undefined) throw new Error(`--${key} needs a value`);
    const camel = key.replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    o[camel] = ['tokens', 'requests', 'longPrompt', 'threads', 'prefillChunk', 'prefillSlowdown'].includes(camel) ? Number(value) : value;
  }
  if (!o.url && !o.model) throw new Error('give --model FILE (a server is started) or --url URL');
  return o;
}

function startServer(o) {
  // Slots for the largest level, and for the 8 streams plus the long prompt
  // of the last experiment (else that prompt waits in the queue).
  const maxClients = Math.max(...o.levels, 8 + 1);
  const args = ['serve', o.model, '--port', '0', '--parallel', String(maxClients), '--queue', String(maxClients),
                '--ctx', String(o.longPrompt + o.tokens + 64)];
  if (o.cpu) args.push('--cpu');
  if (o.threads) args.push('--threads', String(o.threads));
  if (o.prefillChunk) args.push('--prefill-chunk', String(o.prefillChunk));
  if (o.prefillSlowdown !== undefined) args.push('--prefill-slowdown', String(o.prefillSlowdown));
  const child = spawn(o.binary, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  return new Promise((resolve, reject) => {
    child.on('exit', (code) => reject(new Error(`serve exited with ${code}:\n${log}`)));
    child.stderr.on('data', (chunk) => {
      log += chunk;
      const port = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(log)?.[1];
      if (port && /m40-llm: ready/.test(log)) {
        child.removeAllListeners('exit');
        resolve({ url: `http://127.0.0.1:${port}`, stop: () => child.kill('SIGTERM') });
      }
    });
  });
}

// One streamed completion. Returns the arrival time of each text chunk
// (one per token, except where the detokenizer holds bytes back), the
// completion tokens, and the send time.
async function streamOnce(url, model, prompt, maxTokens, signal = undefined) {
  const sent = performance.now();
  const arrivals = [];
  let tokens = 0;
  try {
    await readStream(url, model, prompt, maxTokens, signal, arrivals, (n) => { tokens = n; });
  } catch (e) {
    if (e.name !== 'AbortError') throw e;  // a stream the caller ended
  }
  return { sent, arrivals, tokens };
}

async function readStream(url, model, prompt, maxTokens, signal, arrivals, setTokens) {
  const res = await fetch(`${url}/v1/completions`, {
    signal,
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model, prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true,
                           stream_options: { include_usage: true } }),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let buffer = '';
  const decoder = new TextDecoder();
  for await (const bytes of res.body) {
    const now = performance.now();
    buffer += decoder.decode(bytes, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
      const j = JSON.parse(event.slice(6));
      if (j.error) throw new Error(j.error.message);
      if (j.usage) setTokens(j.usage.completion_tokens);
      if (j.choices?.[0]?.text) arrivals.push(now);
    }
  }
}

const percentile = (values, p) => {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
};
const gaps = (arrivals) => arrivals.slice(1).map((t, i) => t - arrivals[i]);
const ms = (x) => x.toFixed(1);

async function concurrencyLevel(url, model, clients, o) {
  const prompts = ['Once upon a time', 'The little dog', 'Lily and Ben went', 'One day, a bird'];
  const start = performance.now();
  const results = [];
  await Promise.all(Array.from({ length: clients }, async (_, c) => {
    for (let r = 0; r < o.requests; r++) results.push(await streamOnce(url, model, prompts[c % prompts.length], o.tokens));
  }));
  const seconds = (performance.now() - start) / 1000;
  const tokens = results.reduce((n, r) => n + r.tokens, 0);
  const ttft = results.map((r) => r.arrivals[0] - r.sent);
  const itl = results.flatMap((r) => gaps(r.arrivals));
  return { clients, requests: results.length, tokens, tps: tokens / seconds, ttft50: percentile(ttft, 50),
           ttft99: percentile(ttft, 99), itl50: percentile(itl, 50), itl99: percentile(itl, 99) };
}

// 8 streams run; once each has produced tokens for a while, one long prompt
// arrives. Gaps between tokens are split by when they end: before the long
// prompt was sent, between its sending and its answer, or in the 0.5 s after
// the answer (the streams alone again, but with the longer contexts they
// reached meanwhile: their steps cost more than before, prompt or not).
// A prompt of `length` tokens: `sentence` repeated.
async function repeatedPrompt(url, model, sentence, length) {
  const ids = await (await fetch(`${url}/tokenize`, {
    method: 'POST', body: JSON.stringify({ model, content: sentence }),
  })).json();
  const prompt = [];
  while (prompt.length < length) prompt.push(...ids.tokens);
  prompt.length = length;
  return prompt;
}

async function longPromptDuringStreams(url, model, o) {
  const longPrompt = await repeatedPrompt(url, model, ' Once upon a time, there was a little girl named Lily.', o.longPrompt);
  // The streams could outlast the long prompt (up to the context); they are
  // ended once it has been answered.
  const abort = new AbortController();
  const streams = Array.from({ length: 8 }, () => streamOnce(url, model, 'Once upon a time', o.longPrompt, abort.signal));
  await new Promise((r) => setTimeout(r, 500));
  const longSent = performance.now();
  const long = await streamOnce(url, model, longPrompt, 1);
  const longDone = long.arrivals[0] ?? performance.now();
  await new Promise((r) => setTimeout(r, 500));
  abort.abort();
  const results = await Promise.all(streams);
  const before = [];
  const during = [];
  const after = [];
  for (const r of results) {
    r.arrivals.forEach((t, i) => {
      if (i === 0) return;
      const gap = t - r.arrivals[i - 1];
      if (t < longSent) before.push(gap);
      else if (t <= longDone) during.push(gap);
      else if (r.arrivals[i - 1] > longDone) after.push(gap);
    });
  }
  // Then a prompt of the same length alone (other tokens: no cached
  // blocks), for the ratio the pacing is judged by, once the server has
  // seen the streams' clients leave.
  await new Promise((r) => setTimeout(r, 300));
  const alonePrompt = await repeatedPrompt(url, model, ' The sun was warm and the sky was blue over the quiet town.', o.longPrompt);
  const alone = await streamOnce(url, model, alonePrompt, 1);
  const aloneTtft = (alone.arrivals[0] ?? performance.now()) - alone.sent;
  return { promptTokens: longPrompt.length, ttft: longDone - longSent, aloneTtft, before99: percentile(before, 99),
           during99: percentile(during, 99), before50: percentile(before, 50), during50: percentile(during, 50),
           after50: percentile(after, 50), after99: percentile(after, 99),
           beforeN: before.length, duringN: during.length, afterN: after.length };
}

async function main() {
  const o = parseArgs(process.argv);
  const server = o.url ? null : await startServer(o);
  const url = o.url ?? server.url;
  const model = o.modelName ?? (o.model ? path.basename(o.model).replace(/\.gguf$/, '') : undefined);
  try {
    await streamOnce(url, model, 'Hello', 8);  // warm-up
    console.log(`server ${url}, ${o.tokens} tokens per request, ${o.requests} requests per client\n`);
    console.log('| clients | requests | generated tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |');
    console.log('|---:|---:|---:|---:|---:|---:|---:|');
    for (const clients of o.levels) {
      const r = await concurrencyLevel(url, model, clients, o);
      console.log(`| ${clients} | ${r.requests} | ${r.tps.toFixed(0)} | ${ms(r.ttft50)} | ${ms(r.ttft99)} | ${ms(r.itl50)} | ${ms(r.itl99)} |`);
    }
    const l = await longPromptDuringStreams(url, model, o);
    console.log(`\n${l.promptTokens}-token prompt while 8 streams run: its first token after ${ms(l.ttft)} ms ` +
                `(alone: ${ms(l.aloneTtft)} ms, ${(l.ttft / l.aloneTtft).toFixed(2)}x)`);
    console.log('| 8 streams | ITL p50 ms | ITL p99 ms | gaps |');
    console.log('|---|---:|---:|---:|');
    console.log(`| before the long prompt | ${ms(l.before50)} | ${ms(l.before99)} | ${l.beforeN} |`);
    console.log(`| while it is read | ${ms(l.during50)} | ${ms(l.during99)} | ${l.duringN} |`);
    console.log(`| 0.5 s after its answer | ${ms(l.after50)} | ${ms(l.after99)} | ${l.afterN} |`);
  } finally {
    server?.stop();
  }
}

main().catch((e) => { console.error(`error: ${e.message}`); process.exit(1); });
