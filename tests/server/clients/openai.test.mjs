// m40-llm serve through the official OpenAI JavaScript client.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, runAnswer, modelName } from './serve.mjs';

let server;
let client;
const question = 'Tell me a story about a dog.';
const chatSettings = { model: modelName, temperature: 0, max_tokens: 24 };

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

test('chat completion: the greedy answer is what m40-llm run gives', async () => {
  const expected = runAnswer(question, { maxTokens: 24 });
  assert.ok(expected.length > 0);
  const r = await client.chat.completions.create({ ...chatSettings, messages: [{ role: 'user', content: question }] });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, modelName);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, expected);
  assert.equal(r.usage.completion_tokens <= 24, true);
});

test('chat completion streamed: the chunks add up to the same answer', async () => {
  const expected = runAnswer(question, { maxTokens: 24 });
  const stream = await client.chat.completions.create({
    ...chatSettings, messages: [{ role: 'user', content: question }], stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      text += choice.delta?.content ?? '';
      finish = choice.finish_reason ?? finish;
    }
  }
  assert.equal(text, expected);
  assert.ok(chunks > 2, 'the answer came in pieces');
  assert.ok(['stop', 'length'].includes(finish));
  assert.ok(usage.completion_tokens > 0);
});

test('completion (raw prompt): same as m40-llm run --raw, also streamed', async () => {
  const prompt = 'Once upon a time';
  const expected = runAnswer(prompt, { maxTokens: 20, raw: true });
  const r = await client.completions.create({ model: modelName, prompt, temperature: 0, max_tokens: 20 });
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 20);
  const stream = await client.completions.create({ model: modelName, prompt, temperature: 0, max_tokens: 20, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, expected);
});

test('stop strings end the answer before them', async () => {
  const prompt = 'Once upon a time';
  const full = runAnswer(prompt, { maxTokens: 30, raw: true });
  const stop = full.split(' ').filter((w) => w.length > 3)[2];  // a word from the middle
  assert.ok(stop, full);
  const expected = full.slice(0, full.indexOf(stop));
  assert.equal(runAnswer(prompt, { maxTokens: 30, raw: true, stop: [stop] }), expected);
  const r = await client.completions.create({ model: modelName, prompt, temperature: 0, max_tokens: 30, stop: [stop] });
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('max_tokens limits the answer', async () => {
  const r = await client.chat.completions.create({ ...chatSettings, max_tokens: 5, messages: [{ role: 'user', content: 'Hi' }] });
  assert.equal(r.usage.completion_tokens, 5);
  assert.equal(r.choices[0].finish_reason, 'length');
});

test('the model list names the served model; an unknown model is a 404', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes(modelName), ids.join(', '));
  const one = await client.models.retrieve(modelName);
  assert.equal(one.id, modelName);
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'Hi' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
});
