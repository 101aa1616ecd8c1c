// m40-llm serve through the official Ollama JavaScript client.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Ollama } from 'ollama';
import { startServer, runAnswer, modelName, modelPath } from './serve.mjs';

let server;
let ollama;
const question = 'Tell me a story about a cat.';
// Greedy, and without Ollama's default repeat penalty (1.1): what run does
// with --temp 0 --repeat-penalty 1.
const greedy = (n) => ({ temperature: 0, repeat_penalty: 1, num_predict: n });

before(async () => {
  server = await startServer();
  ollama = new Ollama({ host: server.url });
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

test('generate: the greedy answer is what m40-llm run gives', async () => {
  const expected = runAnswer(question, { maxTokens: 24 });
  assert.ok(expected.length > 0);
  const r = await ollama.generate({ model: modelName, prompt: question, options: greedy(24), stream: false });
  assert.equal(r.response, expected);
  assert.equal(r.done, true);
  assert.ok(r.eval_count <= 24);
});

test('generate streamed: the parts add up to the same answer', async () => {
  const expected = runAnswer(question, { maxTokens: 24 });
  const stream = await ollama.generate({ model: modelName, prompt: question, options: greedy(24), stream: true });
  let text = '';
  let parts = 0;
  let last = null;
  for await (const part of stream) {
    text += part.response;
    parts += 1;
    last = part;
  }
  assert.equal(text, expected);
  assert.ok(parts > 2);
  assert.equal(last.done, true);
});

test('chat, streamed and not, equals m40-llm run', async () => {
  const expected = runAnswer(question, { maxTokens: 24 });
  const messages = [{ role: 'user', content: question }];
  const r = await ollama.chat({ model: modelName, messages, options: greedy(24), stream: false });
  assert.equal(r.message.role, 'assistant');
  assert.equal(r.message.content, expected);
  let text = '';
  for await (const part of await ollama.chat({ model: modelName, messages, options: greedy(24), stream: true })) {
    text += part.message.content;
  }
  assert.equal(text, expected);
});

test('stop and num_predict', async () => {
  const prompt = 'Once upon a time';
  const full = runAnswer(prompt, { maxTokens: 30, raw: true });
  const stop = full.split(' ').filter((w) => w.length > 3)[2];
  const r = await ollama.generate({ model: modelName, prompt, raw: true, options: { ...greedy(30), stop: [stop] }, stream: false });
  assert.equal(r.response, full.slice(0, full.indexOf(stop)));
  assert.equal(r.done_reason, 'stop');
  const short = await ollama.generate({ model: modelName, prompt, raw: true, options: greedy(5), stream: false });
  assert.equal(short.eval_count, 5);
  assert.equal(short.done_reason, 'length');
});

test('list, ps, pull and an unknown model', async () => {
  const tags = await ollama.list();
  assert.ok(tags.models.some((m) => m.name === `${modelName}:latest`), JSON.stringify(tags));
  const ps = await ollama.ps();
  assert.equal(ps.models[0].name, `${modelName}:latest`);
  assert.equal(ps.models[0].size_vram, 0);  // --cpu

  // A local GGUF file pulled into the (test's own) store, with progress.
  const statuses = [];
  for await (const p of await ollama.pull({ model: modelPath, stream: true })) statuses.push(p);
  assert.equal(statuses.at(-1).status, 'success');
  assert.ok(statuses.some((p) => p.total > 0 && p.completed === p.total), JSON.stringify(statuses));
  const after = await ollama.list();
  assert.ok(after.models.some((m) => m.name === 'tinystories-656k-q8_0:latest'), JSON.stringify(after));
  const r = await ollama.generate({ model: 'tinystories-656k-q8_0', prompt: 'Hi', options: greedy(3), stream: false });
  assert.equal(r.done, true);

  await assert.rejects(ollama.generate({ model: 'no-such-model', prompt: 'Hi', stream: false }),
                       (e) => e.status_code === 404);
});
