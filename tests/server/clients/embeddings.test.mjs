// m40-llm serve's embeddings through the official OpenAI and Ollama
// JavaScript clients: OpenAI's embeddings.create (which asks for base64 and
// decodes it unless told a format), Ollama's embed and the older
// embeddings. The served TinyStories model is generative: it embeds by its
// last token's hidden state, as Ollama embeds such a model.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { startServer, modelName } from './serve.mjs';

let server;
let openai;
let ollama;

before(async () => {
  server = await startServer();
  openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  ollama = new Ollama({ host: server.url });
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const close = (a, b, tol = 1e-6) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) <= tol);

test('openai embeddings.create: base64 by default, the same values as floats', async () => {
  const input = ['Once upon a time', 'there was a little dog'];
  const r = await openai.embeddings.create({ model: modelName, input });
  assert.equal(r.object, 'list');
  assert.equal(r.model, modelName);
  assert.equal(r.data.length, 2);
  const floats = await openai.embeddings.create({ model: modelName, input, encoding_format: 'float' });
  for (let i = 0; i < 2; i += 1) {
    assert.equal(r.data[i].object, 'embedding');
    assert.equal(r.data[i].index, i);
    assert.ok(r.data[i].embedding.length > 0);
    assert.ok(Math.abs(norm(r.data[i].embedding) - 1) < 1e-5);
    // The decimals read back as the same float32 values the bytes hold.
    assert.deepEqual(r.data[i].embedding, floats.data[i].embedding.map(Math.fround));
  }
  assert.ok(!close(r.data[0].embedding, r.data[1].embedding, 1e-3), 'different texts, different vectors');
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
});

test('openai embeddings.create with dimensions', async () => {
  const full = await openai.embeddings.create({ model: modelName, input: 'a red ball', encoding_format: 'float' });
  const short = await openai.embeddings.create({ model: modelName, input: 'a red ball', dimensions: 8 });
  assert.equal(short.data[0].embedding.length, 8);
  const head = full.data[0].embedding.slice(0, 8);
  const n = norm(head);
  assert.ok(close(short.data[0].embedding, head.map((x) => x / n), 1e-5));
});

test('openai errors: a bad input is a 400 the client raises', async () => {
  await assert.rejects(openai.embeddings.create({ model: modelName, input: '' }), (e) => e.status === 400);
});

test('ollama embed: one vector per text, the same as OpenAI gives', async () => {
  const r = await ollama.embed({ model: modelName, input: ['Once upon a time', 'there was a little dog'] });
  assert.equal(r.embeddings.length, 2);
  assert.ok(r.prompt_eval_count > 0);
  const o = await openai.embeddings.create({ model: modelName, input: 'Once upon a time', encoding_format: 'float' });
  assert.ok(close(r.embeddings[0], o.data[0].embedding));
  const one = await ollama.embed({ model: modelName, input: 'Once upon a time', truncate: true, dimensions: 16 });
  assert.equal(one.embeddings[0].length, 16);
  assert.ok(Math.abs(norm(one.embeddings[0]) - 1) < 1e-5);
});

test('ollama embeddings (the older route): the same vector', async () => {
  const r = await ollama.embeddings({ model: modelName, prompt: 'Once upon a time' });
  const e = await ollama.embed({ model: modelName, input: 'Once upon a time' });
  assert.ok(close(r.embedding, e.embeddings[0]));
});
