// Fill-in-the-middle through the clients editors use: OpenAI's
// completions with `suffix` and Ollama's generate with `suffix`, on a tiny
// random model in StarCoder's vocabulary (written by `m40-llm gen-model`),
// whose <fim_prefix>, <fim_suffix> and <fim_middle> tokens frame the prompt.
// Each answer must equal the one to the prompt spelled out with the markers.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { startServer, binary, sharedDir } from './serve.mjs';

let server;
let openai;
let ollama;
let dir;
let model;

before(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'm40-fim-'));
  model = path.join(dir, 'fim-coder.gguf');
  execFileSync(binary, ['gen-model', model, '--shape', 'tiny-qwen2', '--type', 'f16', '--layers', '1', '--threads', '2',
                        '--tokenizer-from', path.join(sharedDir, 'models', 'vocab', 'ggml-vocab-starcoder.gguf')],
               { stdio: 'ignore' });
  server = await startServer();
  openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  ollama = new Ollama({ host: server.url });
});
after(async () => {
  assert.equal(await server.stop(), 0);
  rmSync(dir, { recursive: true, force: true });
});

const prefix = 'def add(a, b):\n    return ';
const suffix = '\n\nprint(add(1, 2))\n';
const spelled = `<fim_prefix>${prefix}<fim_suffix>${suffix}<fim_middle>`;

test('openai completions with suffix: the answer to the prompt framed by the FIM tokens', async () => {
  const settings = { model, temperature: 0, max_tokens: 8 };
  const fim = await openai.completions.create({ ...settings, prompt: prefix, suffix });
  const framed = await openai.completions.create({ ...settings, prompt: spelled });
  assert.equal(fim.choices[0].text, framed.choices[0].text);
  assert.equal(fim.usage.prompt_tokens, framed.usage.prompt_tokens);
});

test('ollama generate with suffix: the same answer', async () => {
  const options = { temperature: 0, num_predict: 8, repeat_penalty: 1 };
  const fim = await ollama.generate({ model, prompt: prefix, suffix, options });
  const framed = await openai.completions.create({ model, prompt: spelled, temperature: 0, max_tokens: 8 });
  assert.equal(fim.response, framed.choices[0].text);
  const show = await ollama.show({ model });
  assert.ok(show.capabilities.includes('insert'));
});
