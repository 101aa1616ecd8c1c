// Tools, structured output, logprobs and n through the clients agents and
// chat front ends use: openai, ollama, LangChain (@langchain/openai,
// @langchain/ollama) and the Vercel AI SDK (ai with its OpenAI-compatible
// and Ollama providers), unmodified. The model is tiny-qwen2 with random
// weights, served with Qwen 2.5's real chat template
// (--chat-template-file): it calls no tools and writes no JSON by itself,
// so every valid call and document here comes from constrained decoding.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { ChatOpenAI } from '@langchain/openai';
import { ChatOllama } from '@langchain/ollama';
import { tool as langchainTool } from '@langchain/core/tools';
import { generateText, generateObject, tool as aiTool, jsonSchema } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { createOllama } from 'ollama-ai-provider-v2';
import { z } from 'zod';
import { startServer, sharedDir } from './serve.mjs';

const model = path.join(sharedDir, 'models', 'arch', 'tiny-qwen2-F32.gguf');
const template = path.join(sharedDir, 'templates', 'Qwen-Qwen2.5-7B-Instruct.jinja');

let server;
let openai;
let ollama;

before(async () => {
  server = await startServer(['--chat-template-file', template, '--ctx', '1024']);
  openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  ollama = new Ollama({ host: server.url });
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

const weatherParameters = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 6 },
    unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
  },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const weatherTool = {
  type: 'function',
  function: { name: 'get_weather', description: 'The weather in a city', parameters: weatherParameters },
};
const personSchema = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 5 },
    alive: { type: 'boolean' },
    kind: { enum: ['cat', 'dog'] },
  },
  required: ['name', 'alive', 'kind'],
  additionalProperties: false,
};
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
const sampling = { temperature: 1, seed: 3, max_tokens: 200 };

function checkWeather(args) {
  assert.deepEqual(Object.keys(args).sort(), ['city', 'unit']);
  assert.equal(typeof args.city, 'string');
  assert.ok(['celsius', 'fahrenheit'].includes(args.unit));
}
function checkPerson(p) {
  assert.equal(typeof p.name, 'string');
  assert.ok(p.name.length >= 1);
  assert.equal(typeof p.alive, 'boolean');
  assert.ok(['cat', 'dog'].includes(p.kind));
}

test('openai: a required tool call, whole and through the streaming helper', async () => {
  const r = await openai.chat.completions.create({
    model, messages: ask, tools: [weatherTool], tool_choice: 'required', parallel_tool_calls: false, ...sampling,
  });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.tool_calls.length, 1);
  assert.equal(choice.message.tool_calls[0].function.name, 'get_weather');
  checkWeather(JSON.parse(choice.message.tool_calls[0].function.arguments));

  // The SDK's stream helper puts the delta.tool_calls pieces back together.
  const stream = openai.chat.completions.stream({
    model, messages: ask, tools: [weatherTool], parallel_tool_calls: false, ...sampling, seed: 4,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  const final = await stream.finalChatCompletion();
  const call = final.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, 'get_weather');
  assert.ok(call.id.length > 0);
  checkWeather(JSON.parse(call.function.arguments));
});

test('openai: the answer to a tool result renders the whole exchange', async () => {
  const r = await openai.chat.completions.create({
    model, tools: [weatherTool], max_tokens: 4, temperature: 0,
    messages: [
      ...ask,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris","unit":"celsius"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 21}' },
    ],
  });
  assert.ok(r.usage.prompt_tokens > 100);  // the tool definitions and the history are in the prompt
});

test('openai: json_schema response_format parsed by the SDK, logprobs and n', async () => {
  const r = await openai.chat.completions.parse({
    model, messages: [{ role: 'user', content: 'A pet?' }], ...sampling, n: 2, logprobs: true, top_logprobs: 2,
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: personSchema } },
  });
  assert.equal(r.choices.length, 2);
  for (const choice of r.choices) {
    checkPerson(choice.message.parsed);
    assert.equal(choice.logprobs.content.length > 0, true);
    for (const t of choice.logprobs.content) {
      assert.ok(t.logprob <= 0);
      // Two alternatives, or one where the grammar allows only one token.
      assert.ok(t.top_logprobs.length >= 1 && t.top_logprobs.length <= 2);
    }
  }
  assert.equal(r.choices[0].logprobs.content.length + r.choices[1].logprobs.content.length, r.usage.completion_tokens);
});

test('ollama: format schema, format json, tools accepted, capabilities', async () => {
  const r = await ollama.chat({
    model, messages: [{ role: 'user', content: 'A pet?' }], format: personSchema, stream: false,
    options: { temperature: 1, seed: 5, num_predict: 200 },
  });
  checkPerson(JSON.parse(r.message.content));
  // Tools with the model free to answer: random weights write text, not a call.
  const t = await ollama.chat({ model, messages: ask, tools: [weatherTool], stream: false, options: { num_predict: 4 } });
  assert.equal(t.message.role, 'assistant');
  const show = await ollama.show({ model });
  assert.ok(show.capabilities.includes('tools'));
});

test('LangChain ChatOpenAI: bindTools with a required call, withStructuredOutput', async () => {
  const llm = new ChatOpenAI({
    model, temperature: 1, maxTokens: 200, apiKey: 'unused', configuration: { baseURL: `${server.url}/v1` },
    modelKwargs: { seed: 6 },
  });
  const getWeather = langchainTool(async () => 'sunny', {
    name: 'get_weather', description: 'The weather in a city',
    schema: z.object({ city: z.string().max(6), unit: z.enum(['celsius', 'fahrenheit']) }),
  });
  const withTools = llm.bindTools([getWeather], { tool_choice: 'required', parallel_tool_calls: false });
  const msg = await withTools.invoke('Weather in Paris?');
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].name, 'get_weather');
  checkWeather(msg.tool_calls[0].args);

  const structured = llm.withStructuredOutput(
    z.object({ name: z.string().min(1).max(5), alive: z.boolean(), kind: z.enum(['cat', 'dog']) }),
    { name: 'person', method: 'jsonSchema', strict: true },
  );
  checkPerson(await structured.invoke('A pet?'));
});

test('LangChain ChatOllama: structured output through format', async () => {
  const llm = new ChatOllama({ model, baseUrl: server.url, temperature: 1, seed: 7, numPredict: 200 });
  const structured = llm.withStructuredOutput(
    z.object({ name: z.string().min(1).max(5), alive: z.boolean(), kind: z.enum(['cat', 'dog']) }),
    { method: 'jsonSchema' },
  );
  checkPerson(await structured.invoke('A pet?'));
});

test('AI SDK (OpenAI-compatible provider): a required tool call and generateObject', async () => {
  const provider = createOpenAICompatible({ name: 'm40', baseURL: `${server.url}/v1`, supportsStructuredOutputs: true });
  const result = await generateText({
    model: provider(model), prompt: 'Weather in Paris?', temperature: 1, seed: 8, maxOutputTokens: 200,
    tools: { get_weather: aiTool({ description: 'The weather in a city', inputSchema: jsonSchema(weatherParameters) }) },
    toolChoice: 'required',
  });
  assert.ok(result.toolCalls.length >= 1);
  assert.equal(result.toolCalls[0].toolName, 'get_weather');
  checkWeather(result.toolCalls[0].input);

  const { object } = await generateObject({
    model: provider(model), prompt: 'A pet?', temperature: 1, seed: 9, maxOutputTokens: 200, schema: jsonSchema(personSchema),
  });
  checkPerson(object);
});

test('AI SDK (Ollama provider): generateObject', async () => {
  const provider = createOllama({ baseURL: `${server.url}/api` });
  const { object } = await generateObject({
    model: provider(model), prompt: 'A pet?', temperature: 1, seed: 10, maxOutputTokens: 200, schema: jsonSchema(personSchema),
  });
  checkPerson(object);
});
