// The server on a reference fixture (no tokenizer: token ids in, "token_id:N" out), driven by the official
// openai client: greedy ids, the first token's log-probabilities and the embedding against transformers'
// reference.safetensors; the API key (401 in OpenAI's shape without it, constant-time compared);
// text where the model has no tokenizer is a 400.
//   node client_fixture.mjs BASE_URL FIXTURE_DIR API_KEY
import net from 'node:net';
import OpenAI from 'openai';
import { check, done, logSoftmax, readSafetensors, step } from './util.mjs';

const [base, dir, key] = process.argv.slice(2);
const model = dir.split('/').filter(Boolean).pop();
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const st = readSafetensors(`${dir}/reference.safetensors`);
const ids = Array.from(st.input_ids.data, Number);
const greedy = Array.from(st.greedy_ids.data, Number);

await step('greedy ids and logprobs', async () => {
  const r = await client.completions.create({
    model, prompt: ids, max_tokens: greedy.length, temperature: 0, ignore_eos: true, logprobs: 5,
  });
  const got = r.choices[0].logprobs.tokens.map((t) => Number(t.slice('token_id:'.length)));
  check(got.length === greedy.length && got.every((v, i) => v === greedy[i]), `${greedy.length} greedy ids equal transformers'`);
  const L = st.logits, T = L.shape[0], V = L.shape[1];
  const row = logSoftmax(L.data.subarray((T - 1) * V, T * V));
  const top = r.choices[0].logprobs.top_logprobs[0];
  let worst = 0;
  for (const [tok, lp] of Object.entries(top)) worst = Math.max(worst, Math.abs(lp - row[Number(tok.slice(9))]));
  const best = Object.entries(top).sort((a, b) => b[1] - a[1])[0][0];
  check(Object.keys(top).length === 5 && best === `token_id:${greedy[0]}` && worst < 2e-3,
    `first token: top 5 log-probabilities within ${worst.toExponential(2)} of transformers' log-softmax`);
});

await step('embeddings', async () => {
  const F = st.final_norm, T = F.shape[0], H = F.shape[1];
  const want = new Float64Array(H);
  for (let t = 0; t < T; t++) for (let h = 0; h < H; h++) want[h] += F.data[t * H + h] / T;
  const norm = Math.sqrt(want.reduce((s, v) => s + v * v, 0));
  const r = await client.embeddings.create({ model, input: ids });
  const got = r.data[0].embedding;
  let worst = 0;
  for (let h = 0; h < H; h++) worst = Math.max(worst, Math.abs(got[h] - want[h] / norm));
  check(got.length === H && worst < 1e-3, `embedding = the normalized mean of transformers' final hidden states (${worst.toExponential(2)})`);
});

await step('no tokenizer', async () => {
  for (const [what, fn] of [
    ['completions with text', () => client.completions.create({ model, prompt: 'hello' })],
    ['chat', () => client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] })],
    ['embeddings of text', () => client.embeddings.create({ model, input: 'hello' })],
  ]) {
    try {
      await fn();
      check(false, `${what}: no error`);
    } catch (e) {
      check(e.status === 400 && /tokenizer/.test(e.message), `${what} without a tokenizer: 400 (${e.message})`);
    }
  }
});

await step('api key', async () => {
  for (const bad of ['wrong', key + 'x', key.slice(0, -1)]) {
    const c = new OpenAI({ baseURL: `${base}/v1`, apiKey: bad, maxRetries: 0 });
    try {
      await c.models.list();
      check(false, `key ${JSON.stringify(bad)}: no error`);
    } catch (e) {
      check(e instanceof OpenAI.AuthenticationError && e.code === 'invalid_api_key', `key ${JSON.stringify(bad)}: 401 invalid_api_key`);
    }
  }
  const none = await fetch(`${base}/v1/models`);
  const body = await none.json();
  check(none.status === 401 && body.error.code === 'invalid_api_key' && body.error.type === 'invalid_request_error',
    'no Authorization header: 401 in OpenAI\'s shape');
  // a wrong key is refused from the headers, before the body is read: a client without the key cannot make the
  // server hold --max-body bytes per connection
  const url = new URL(base);
  const early = await new Promise((resolve) => {
    const s = net.connect(Number(url.port), url.hostname);
    let text = '';
    const timer = setTimeout(() => { s.destroy(); resolve(text); }, 3000);
    s.on('error', () => {});
    s.on('data', (d) => { text += d.toString('latin1'); if (text.includes('invalid_api_key')) { clearTimeout(timer); s.destroy(); resolve(text); } });
    s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nContent-Length: 4000000\r\n\r\n{');
  });
  check(/^HTTP\/1\.1 401/.test(early) && early.includes('invalid_api_key'),
    `a wrong key with a 4 MB body to come: 401 before the body (${JSON.stringify(early.slice(0, 40))})`);
  const h = await fetch(`${base}/health`);
  check(h.status === 200, '/health needs no key');
  const m = await fetch(`${base}/metrics`);
  check(m.status === 401, '/metrics needs the key');
});

done();
