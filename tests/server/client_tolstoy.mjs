// The server on the example model, driven by the official openai client (tests/test_server.sh):
// chat and completions against what transformers produced (reference.json / reference.safetensors),
// streaming equals plain, logprobs equal the log-softmax of transformers' logits, seeds, stop strings,
// logit_bias, embeddings (base64 and float), errors in OpenAI's shape, and cancellation (the request's
// generation stops and its KV blocks go back).
//   node client_tolstoy.mjs BASE_URL MODEL_DIR
import fs from 'node:fs';
import OpenAI from 'openai';
import { check, done, logSoftmax, metrics, readSafetensors, step, waitMetrics } from './util.mjs';

const [base, dir] = process.argv.slice(2);
const ref = JSON.parse(fs.readFileSync(`${dir}/reference.json`, 'utf8'));
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const model = 'tolstoy-tiny';
const chatMessages = [{ role: 'user', content: ref.chat_user }];

await step('models', async () => {
  const list = await client.models.list();
  check(list.data.length === 1 && list.data[0].id === model, `models.list has ${model}`);
  const one = await client.models.retrieve(model);
  check(one.id === model && one.object === 'model', 'models.retrieve');
});

let plain;
await step('chat', async () => {
  plain = await client.chat.completions.create({ model, messages: chatMessages, temperature: 0, max_tokens: 48 });
  const m = plain.choices[0].message;
  check(m.role === 'assistant' && m.content === ref.chat_greedy_text,
    `chat, greedy: transformers' reply (${JSON.stringify(m.content).slice(0, 60)}...)`);
  check(plain.usage.prompt_tokens === ref.chat_prompt_ids.length && plain.usage.completion_tokens === 48 &&
    plain.usage.total_tokens === plain.usage.prompt_tokens + 48, 'chat usage counts the prompt and the reply');
  check(plain.choices[0].finish_reason === 'length' && plain.object === 'chat.completion' &&
    plain.id.startsWith('chatcmpl-'), 'chat: finish_reason length, object, id');
});

await step('chat stream', async () => {
  const stream = await client.chat.completions.create({
    model, messages: chatMessages, temperature: 0, max_tokens: 48, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', first = null, finish = null, usage = null, chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (!first) first = c;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta.content) text += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  check(first && first.choices[0].delta.role === 'assistant', 'stream: the first chunk carries the role');
  check(text === ref.chat_greedy_text && chunks > 10, `stream: the deltas add up to the plain reply (${chunks} chunks)`);
  check(finish === 'length' && usage && usage.completion_tokens === 48 && usage.prompt_tokens === ref.chat_prompt_ids.length,
    'stream: finish_reason and the usage chunk (stream_options.include_usage)');
});

await step('prefix cache', async () => {
  // the prefix cache holds whole KV blocks (32 positions, the library's default), and a prompt's last token is
  // read again for its logits: the same prompt again finds all of it but its last partial block
  const body = { model, prompt: ref.prompt.repeat(20), max_tokens: 4, temperature: 0 };
  const a = await client.completions.create(body);
  const b = await client.completions.create(body);
  const n = b.usage.prompt_tokens, whole = Math.floor((n - 1) / 32) * 32;
  check(n > 64 && a.choices[0].text === b.choices[0].text, `the same ${n}-token prompt twice gives the same text`);
  check(b.usage.prompt_tokens_details.cached_tokens === whole,
    `the second time ${b.usage.prompt_tokens_details.cached_tokens} of its tokens come from the KV cache (${whole} expected)`);
});

await step('text parts', async () => {
  const r = await client.chat.completions.create({
    model, temperature: 0, max_tokens: 8,
    messages: [{ role: 'user', content: [{ type: 'text', text: ref.chat_user }] }],
  });
  check(ref.chat_greedy_text.startsWith(r.choices[0].message.content) && r.choices[0].message.content.length > 0,
    'chat: content as text parts renders as the string');
});

await step('completions', async () => {
  const body = { model, max_tokens: 32, temperature: 0, ignore_eos: true };
  const a = await client.completions.create({ ...body, prompt: ref.prompt });
  check(a.choices[0].text === ref.greedy_text && a.object === 'text_completion', 'completions: transformers\' greedy text');
  const b = await client.completions.create({ ...body, prompt: ref.input_ids });
  check(b.choices[0].text === ref.greedy_text && b.usage.prompt_tokens === ref.input_ids.length,
    'completions: a prompt of token ids');
  const s = await client.completions.create({ ...body, prompt: ref.prompt, stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.text ?? '';
  check(text === ref.greedy_text, 'completions stream adds up to the plain text');
  const stop = ' whole';
  const c = await client.completions.create({ ...body, prompt: ref.prompt, stop: [stop, 'never'] });
  const want = ref.greedy_text.slice(0, ref.greedy_text.indexOf(stop));
  check(c.choices[0].text === want && c.choices[0].finish_reason === 'stop', `completions: stop string ${JSON.stringify(stop)}`);
  const e = await client.completions.create({ ...body, max_tokens: 4, prompt: ref.prompt, echo: true });
  check(e.choices[0].text.startsWith(ref.prompt) && ref.greedy_text.startsWith(e.choices[0].text.slice(ref.prompt.length)),
    'completions: echo');
  let echoed = '';
  for await (const ch of await client.completions.create({ ...body, max_tokens: 4, prompt: ref.prompt, echo: true, stream: true }))
    echoed += ch.choices[0]?.text ?? '';
  check(echoed === e.choices[0].text, `completions: echo, streamed, starts with the prompt too (${JSON.stringify(echoed.slice(0, 40))})`);
  const two = await client.completions.create({ ...body, max_tokens: 4, prompt: [ref.prompt, ref.input_ids] });
  check(two.choices.length === 2 && two.choices[1].index === 1 && two.choices[0].text === two.choices[1].text,
    'completions: two prompts, two choices');
});

await step('logprobs', async () => {
  const st = readSafetensors(`${dir}/reference.safetensors`);
  const L = st.logits, T = L.shape[0], V = L.shape[1];
  const row = logSoftmax(L.data.subarray((T - 1) * V, T * V));
  const order = Array.from(row.keys()).sort((x, y) => row[y] - row[x]);
  const r = await client.completions.create({ model, prompt: ref.input_ids, max_tokens: 1, temperature: 0, logprobs: 5 });
  const lp = r.choices[0].logprobs;
  const top = Object.values(lp.top_logprobs[0]).sort((x, y) => y - x);
  let worst = Math.abs(lp.token_logprobs[0] - row[ref.greedy_ids[0]]);
  for (let i = 0; i < 5; i++) worst = Math.max(worst, Math.abs(top[i] - row[order[i]]));
  check(top.length === 5 && worst < 2e-3, `completions logprobs: top 5 within ${worst.toExponential(2)} of transformers' log-softmax`);
  const c = await client.chat.completions.create({
    model, messages: chatMessages, temperature: 0, max_tokens: 4, logprobs: true, top_logprobs: 3,
  });
  const content = c.choices[0].logprobs.content;
  check(content.length === 4 && content.every((t) => t.top_logprobs.length === 3 && t.top_logprobs[0].logprob === t.logprob &&
    Buffer.from(t.bytes).toString('utf8') === t.token), 'chat logprobs: 4 tokens, their top 3, bytes');
  check(content.map((t) => t.token).join('') === c.choices[0].message.content, 'chat logprobs: the tokens spell the reply');
  // logprobs without top_logprobs: each token's own, no alternatives (a 0-byte copy from a NULL list aborted the
  // sanitizer build's server)
  const own = await client.chat.completions.create({ model, messages: chatMessages, temperature: 0, max_tokens: 4, logprobs: true });
  const oc = own.choices[0].logprobs.content;
  check(oc.length === 4 && oc.every((t, i) => t.top_logprobs.length === 0 && t.logprob === content[i].logprob),
    'chat logprobs without top_logprobs: the same log-probabilities, no alternatives');
  // logit_bias -100 on the greedy token: another one comes first
  const banned = await client.completions.create({
    model, prompt: ref.input_ids, max_tokens: 1, temperature: 0, logprobs: 1, logit_bias: { [ref.greedy_ids[0]]: -100 },
  });
  check(Math.abs(banned.choices[0].logprobs.token_logprobs[0] - row[order[1]]) < 2e-3, 'logit_bias -100 bans the greedy token');
});

await step('seeds and n', async () => {
  const body = { model, messages: chatMessages, max_tokens: 12, temperature: 1, seed: 1234, n: 2 };
  const a = await client.chat.completions.create(body);
  const b = await client.chat.completions.create(body);
  check(a.choices.length === 2 && a.choices.map((c) => c.index).join() === '0,1', 'n: 2 choices, indexed');
  check(a.choices.every((c, i) => c.message.content === b.choices[i].message.content), 'the same seed gives the same choices');
  check(a.usage.completion_tokens === 24, 'usage adds up every choice');
  // presence and frequency penalties see the generated tokens only: the prompt already holds the next greedy token,
  // which still comes; repetition_penalty sees the prompt too, as vLLM's (apply_penalties: prompt_mask | output_mask)
  const prompt = [...ref.input_ids, ...ref.greedy_ids.slice(0, 5)];
  const greedy = await client.completions.create({ model, prompt, max_tokens: 1, temperature: 0 });
  const p = await client.completions.create({ model, prompt, max_tokens: 1, temperature: 0, presence_penalty: 2, frequency_penalty: 2 });
  check(prompt.includes(ref.greedy_ids[5]) && p.choices[0].text === greedy.choices[0].text,
    `presence/frequency penalties do not look at the prompt (${JSON.stringify(p.choices[0].text)})`);
  const r = await client.completions.create({ model, prompt, max_tokens: 1, temperature: 0, repetition_penalty: 100 });
  check(r.choices[0].text !== greedy.choices[0].text,
    `repetition_penalty looks at the prompt (${JSON.stringify(r.choices[0].text)}, greedy ${JSON.stringify(greedy.choices[0].text)})`);
});

await step('embeddings', async () => {
  const b64 = await client.embeddings.create({ model, input: ref.prompt });
  const flt = await client.embeddings.create({ model, input: ref.prompt, encoding_format: 'float' });
  const x = b64.data[0].embedding, y = flt.data[0].embedding;
  const norm = Math.sqrt(x.reduce((s, v) => s + v * v, 0));
  check(x.length === 128 && Math.abs(norm - 1) < 1e-5, `embedding: 128 values of unit length (${norm})`);
  check(x.every((v, i) => Math.abs(v - y[i]) < 1e-6), 'embedding: base64 (the client\'s default) equals float');
  const ids = await client.embeddings.create({ model, input: [ref.input_ids, 'War'], encoding_format: 'float' });
  check(ids.data.length === 2 && ids.data[1].index === 1 && ids.data[0].embedding.every((v, i) => Math.abs(v - y[i]) < 1e-5),
    'embeddings: token ids embed as their text; several inputs');
  check(ids.usage.prompt_tokens > ref.input_ids.length && ids.usage.total_tokens === ids.usage.prompt_tokens,
    'embeddings: usage');
});

async function expectError(what, fn, status, code, param) {
  try {
    await fn();
    check(false, `${what}: no error`);
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === status && (!code || e.code === code) && (!param || e.param === param) &&
      typeof e.error?.message === 'string' && e.error.message.length > 0 && e.type,
      `${what}: ${status}${code ? ' ' + code : ''} (${e.status} ${e.code} ${e.param}: ${e.error?.message ?? e.message})`);
  }
}

await step('errors', async () => {
  const m = chatMessages;
  await expectError('unknown model', () => client.chat.completions.create({ model: 'gpt-5', messages: m }), 404, 'model_not_found');
  await expectError('temperature 5', () => client.chat.completions.create({ model, messages: m, temperature: 5 }), 400, null, 'temperature');
  await expectError('max_tokens "ten"', () => client.chat.completions.create({ model, messages: m, max_tokens: 'ten' }), 400, 'invalid_type', 'max_tokens');
  await expectError('no messages', () => client.chat.completions.create({ model }), 400, null, 'messages');
  await expectError('a prompt over the context', () => client.completions.create({ model, prompt: 'Pierre '.repeat(600) }), 400, 'context_length_exceeded');
  await expectError('max_tokens over the context', () => client.completions.create({ model, prompt: ref.prompt, max_tokens: 600 }), 400, 'context_length_exceeded');
  await expectError('an image_url part', () => client.chat.completions.create({
    model, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } }] }],
  }), 400, 'unsupported_content');
  await expectError('an input_audio part', () => client.chat.completions.create({
    model, messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'UklGRg==', format: 'wav' } }] }],
  }), 400, 'unsupported_content');
  await expectError('tool_choice required without tools', () => client.chat.completions.create({
    model, messages: m, tool_choice: 'required',
  }), 400, null, 'tool_choice');
  await expectError('tool_choice of no known kind', () => client.chat.completions.create({
    model, messages: m, tool_choice: 'bogus', tools: [{ type: 'function', function: { name: 'f' } }],
  }), 400, 'invalid_value', 'tool_choice');
  await expectError('json_schema without a schema', () => client.chat.completions.create({
    model, messages: m, response_format: { type: 'json_schema', json_schema: { name: 'x' } },
  }), 400, null, 'response_format.json_schema');
  await expectError('an empty embedding input', () => client.embeddings.create({ model, input: '' }), 400, null, 'input');
  await expectError('token id out of range', () => client.completions.create({ model, prompt: [1, 2, 999999] }), 400, null, 'prompt');
  const r = await client.chat.completions.create({ model, messages: m, max_tokens: 1, temperature: 0, user: 'u', metadata: { a: 'b' }, some_future_field: 1 });
  check(r.choices.length === 1, 'unknown fields are ignored');
});

await step('response_format json_object', async () => {
  let closed = 0;
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({
      model, seed, max_tokens: 60, response_format: { type: 'json_object' },
      messages: [{ role: 'user', content: 'Describe Pierre in JSON.' }],
    });
    const text = r.choices[0].message.content, why = r.choices[0].finish_reason;
    let ok, parsed;
    try {
      parsed = JSON.parse(text);
    } catch (e) { // cut by max_tokens: V8's parser fails only at the end of the text
      const m = /at position (\d+)/.exec(e.message);
      ok = why === 'length' && text.startsWith('{') &&
        (/Unexpected end of JSON input/.test(e.message) || (m && Number(m[1]) >= text.length - 1));
    }
    if (parsed !== undefined) {
      ok = why === 'stop' && typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed);
      closed++;
    }
    check(ok, `json_object (seed ${seed}): an object, or one cut by max_tokens (${why}: ${JSON.stringify(text).slice(0, 80)})`);
  }
  console.log(`json_object: ${closed} of 3 replies closed their object within 60 tokens`);
});

await step('response_format json_schema and forced tool calls', async () => {
  const schema = {
    type: 'object', additionalProperties: false, required: ['name', 'age'],
    properties: { name: { type: 'string', maxLength: 10 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
  };
  let closed = 0;
  for (const seed of [1, 2]) {
    const r = await client.chat.completions.create({
      model, seed, max_tokens: 60, response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } },
      messages: [{ role: 'user', content: 'Describe Pierre in JSON.' }],
    });
    const text = r.choices[0].message.content, why = r.choices[0].finish_reason;
    if (why === 'stop') {
      const p = JSON.parse(text);
      closed++;
      check(Object.keys(p).join() === 'name,age' && typeof p.name === 'string' && [...p.name].length <= 10 &&
        Number.isInteger(p.age) && p.age >= 0 && p.age <= 120, `json_schema (seed ${seed}): ${text}`);
    } else {
      check(why === 'length' && text.startsWith('{"name"'), `json_schema (seed ${seed}) cut: ${JSON.stringify(text)}`);
    }
  }
  console.log(`json_schema: ${closed} of 2 replies closed their object within 60 tokens`);
  const bad = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: 'a+' } } } }),
  });
  const err = await bad.json();
  check(bad.status === 400 && /pattern/.test(err.error.message), `an unsupported keyword is a 400 (${bad.status} ${err.error?.message})`);
  const tools = [
    { type: 'function', function: { name: 'lookup', parameters: { type: 'object', required: ['who'], properties: { who: { type: 'string', maxLength: 12 } } } } },
    { type: 'function', function: { name: 'now' } },
  ];
  for (const choice of ['required', { type: 'function', function: { name: 'lookup' } }]) {
    const r = await client.chat.completions.create({
      model, tools, tool_choice: choice, seed: 5, max_tokens: 40, messages: [{ role: 'user', content: 'Who is Pierre?' }],
    });
    const m = r.choices[0].message, why = r.choices[0].finish_reason;
    const calls = m.tool_calls || [];
    const named = typeof choice === 'object';
    check(why === 'length' || (calls.length >= 1 && calls.every((c) => (named ? c.function.name === 'lookup' : ['lookup', 'now'].includes(c.function.name)) &&
      (c.function.name === 'now' || typeof JSON.parse(c.function.arguments).who === 'string'))),
    `tool_choice ${JSON.stringify(choice)}: ${why} ${JSON.stringify(calls)}`);
  }
});

await step('llama.cpp and vLLM constraints: grammar, guided_choice, guided_regex', async () => {
  const c = await client.completions.create({
    model, prompt: 'War and', max_tokens: 12, seed: 3, grammar: 'root ::= ("war" | "peace") " and " ("war" | "peace")',
  });
  check(/^(war|peace) and (war|peace)$/.test(c.choices[0].text) && c.choices[0].finish_reason === 'stop',
    `completions with a GBNF grammar: ${JSON.stringify(c.choices[0].text)} (${c.choices[0].finish_reason})`);
  const r = await client.chat.completions.create({
    model, seed: 4, max_tokens: 8, guided_choice: ['yes', 'no'], messages: [{ role: 'user', content: 'Is Pierre rich?' }],
  });
  check(['yes', 'no'].includes(r.choices[0].message.content) && r.choices[0].finish_reason === 'stop',
    `chat with guided_choice: ${JSON.stringify(r.choices[0].message.content)}`);
  const x = await client.chat.completions.create({
    model, seed: 5, max_tokens: 12, guided_regex: '18[0-9]{2}', messages: [{ role: 'user', content: 'When?' }],
  });
  check(/^18[0-9]{2}$/.test(x.choices[0].message.content), `chat with guided_regex: ${JSON.stringify(x.choices[0].message.content)}`);
});

await step('tool messages (release template: tool_responses)', async () => {
  const call = { id: 'call_1', type: 'function', function: { name: 'lookup', arguments: '{"who":"Pierre"}' } };
  const tools = [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: { who: { type: 'string' } } } } }];
  const head = [...chatMessages, { role: 'assistant', content: null, tool_calls: [call] }];
  const a = await client.chat.completions.create({ model, tools, temperature: 0, max_tokens: 1, messages: head });
  const b = await client.chat.completions.create({
    model, tools, temperature: 0, max_tokens: 1, messages: [...head, { role: 'tool', tool_call_id: 'call_1', content: '{"born":1772}' }],
  });
  check(b.usage.prompt_tokens > a.usage.prompt_tokens, `a tool result is rendered (${a.usage.prompt_tokens} -> ${b.usage.prompt_tokens} prompt tokens)`);
});

await step('cancel', async () => {
  const before = await metrics(base);
  const cancelled0 = before['gemma4c_generations_cancelled_total'];
  // a stream the client drops after its first content
  const ac = new AbortController();
  const stream = await client.chat.completions.create(
    { model, messages: chatMessages, temperature: 0, max_tokens: 400, ignore_eos: true, stream: true }, { signal: ac.signal });
  let got = 0;
  try {
    for await (const c of stream) if (c.choices[0]?.delta?.content && ++got === 2) ac.abort();
  } catch (e) { /* the abort */ }
  let m = await waitMetrics(base, (x) => x['gemma4c_generations_cancelled_total'] >= cancelled0 + 1 &&
    x['gemma4c_requests_running'] === 0);
  check(m['gemma4c_generations_cancelled_total'] >= cancelled0 + 1 && m['gemma4c_requests_running'] === 0,
    'a stream the client leaves is cancelled');
  // a plain request the client gives up on once the server runs it (400 tokens whatever the model says: it is still
  // generating when the abort comes, on a fast machine too)
  const ac2 = new AbortController();
  const p = client.chat.completions.create({ model, messages: chatMessages, temperature: 0, max_tokens: 400, ignore_eos: true },
    { signal: ac2.signal });
  await waitMetrics(base, (x) => x['gemma4c_requests_running'] >= 1, 5000);
  ac2.abort();
  await p.catch(() => {});
  m = await waitMetrics(base, (x) => x['gemma4c_generations_cancelled_total'] >= cancelled0 + 2 &&
    x['gemma4c_requests_running'] === 0);
  check(m['gemma4c_generations_cancelled_total'] >= cancelled0 + 2 && m['gemma4c_requests_running'] === 0,
    'a plain request the client leaves is cancelled');
  check(m['gemma4c_kv_blocks_used'] <= before['gemma4c_kv_blocks_used'],
    `the cancelled requests' KV blocks are free again (${m['gemma4c_kv_blocks_used']} used, ${before['gemma4c_kv_blocks_used']} before)`);
  const after = await client.chat.completions.create({ model, messages: chatMessages, temperature: 0, max_tokens: 8 });
  check(ref.chat_greedy_text.startsWith(after.choices[0].message.content), 'the server answers right after');
});

done();
