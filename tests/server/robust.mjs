// The server under bad input (tests/test_server_robust.sh): malformed JSON and wrong types answer 400 in
// OpenAI's error shape, oversized bodies 413, unknown routes 404, wrong methods 405; slow clients, garbage
// that is not HTTP, huge headers, idle sockets and clients that leave mid-stream do not stop it serving;
// then a seeded fuzz run of malformed requests (never a 5xx, never a dropped connection); last, SIGTERM
// while a stream runs: the stream ends whole, new connections are refused, and the server exits (the
// shell checks its status).
//   node robust.mjs BASE_URL SERVER_PID FUZZ_COUNT
import net from 'node:net';
import { check, done, metrics, sleep, step, waitMetrics } from './util.mjs';

const [base, pidArg, fuzzArg] = process.argv.slice(2);
const pid = Number(pidArg), fuzzCount = Number(fuzzArg);
const url = new URL(base);
const model = 'tolstoy-tiny';

// One raw HTTP exchange: sends `data`, reads until the server closes or `ms` pass. {status, headers, body, closed}
function raw(data, { ms = 30000, keepOpen = false } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(Number(url.port), url.hostname);
    const chunks = [];
    let closed = false;
    const finish = () => {
      const text = Buffer.concat(chunks).toString('latin1');
      const m = /^HTTP\/1\.[01] (\d+)/.exec(text);
      const i = text.indexOf('\r\n\r\n');
      resolve({ status: m ? Number(m[1]) : 0, head: i >= 0 ? text.slice(0, i) : text, body: i >= 0 ? text.slice(i + 4) : '', closed, socket: s });
    };
    const timer = setTimeout(() => { if (!keepOpen) s.destroy(); finish(); }, ms);
    s.on('data', (d) => chunks.push(d));
    s.on('error', () => {});
    s.on('close', () => { closed = true; clearTimeout(timer); finish(); });
    s.write(data);
  });
}

function post(path, body, extraHeaders = '') {
  const b = Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8');
  return Buffer.concat([Buffer.from(`POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${b.length}\r\nConnection: close\r\n${extraHeaders}\r\n`), b]);
}

// A decoded chunked body (or the body as is).
function dechunk(head, body) {
  if (!/transfer-encoding: chunked/i.test(head)) return body;
  let out = '', i = 0;
  for (;;) {
    const j = body.indexOf('\r\n', i);
    if (j < 0) return out;
    const n = parseInt(body.slice(i, j), 16);
    if (!n) return out;
    out += body.slice(j + 2, j + 2 + n);
    i = j + 2 + n + 2;
  }
}

function isErrorShape(text) {
  try {
    const e = JSON.parse(text).error;
    return e && typeof e.message === 'string' && e.message.length > 0 && !e.message.includes('\n') &&
      typeof e.type === 'string' && 'param' in e && 'code' in e;
  } catch {
    return false;
  }
}

async function expectStatus(what, req, status) {
  const r = await raw(req);
  const body = dechunk(r.head, r.body);
  check(r.status === status && isErrorShape(body), `${what}: ${status} in OpenAI's error shape (${r.status} ${body.slice(0, 120)})`);
}

const chat = (extra) => JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, ...extra });

await step('malformed', async () => {
  await expectStatus('truncated JSON', post('/v1/chat/completions', '{"model": "tolstoy-tiny", "messages": ['), 400);
  await expectStatus('not JSON', post('/v1/chat/completions', 'model=tolstoy-tiny'), 400);
  await expectStatus('empty body', post('/v1/chat/completions', ''), 400);
  for (const v of ['[1,2]', '"x"', 'null', '42', 'true'])
    await expectStatus(`a JSON ${v} body`, post('/v1/chat/completions', v), 400);
  await expectStatus('invalid UTF-8', post('/v1/chat/completions', Buffer.from([...Buffer.from('{"model":"'), 0xff, 0xfe, ...Buffer.from('"}')])), 400);
  await expectStatus('deep nesting', post('/v1/completions', '['.repeat(60000)), 400);
  await expectStatus('a number past double', post('/v1/chat/completions', chat({ temperature: 1 }).replace('"temperature":1', '"temperature":1e400')), 400);
  await expectStatus('NUL escape in a string', post('/v1/chat/completions', '{"model":"tolstoy-tiny","messages":[{"role":"user","content":"a\\u0000b"}]}'), 400);
  const wrong = [{ messages: 'hi' }, { messages: [1] }, { messages: [{ role: 'wizard', content: 'x' }] }, { messages: [{ content: 'x' }] },
    { stream: 'yes' }, { n: 0 }, { n: 1000 }, { stop: 5 }, { stop: Array(40).fill('x') }, { stop: '' }, { stop: ['x', ''] },
    { logit_bias: { abc: 1 } },
    { logit_bias: { 5: 500 } }, { seed: 1.5 }, { max_tokens: -1 }, { max_tokens: 1e12 }, { temperature: 'hot' }, { top_p: 0 },
    { top_logprobs: 3 }, { logprobs: true, top_logprobs: 50 }, { tools: {} }, { tools: [{ type: 'function' }] },
    { tools: [{ type: 'function', function: { name: '' } }] }, { tools: [{ type: 'function', function: { name: 3 } }] },
    { tools: [{ type: 'function', function: { name: 'f' } }, { type: 'function', function: { name: 'f' } }] },
    { stream_options: { include_usage: true } }, { response_format: { type: 'xml' } }, { reasoning_effort: 'max' },
    { messages: [{ role: 'user', content: [{ type: 'video', video: {} }] }] },
    { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,@@@not base64@@@' } }] }] },
    { messages: [{ role: 'tool', content: 'x', tool_call_id: 'nope' }] }, { model: 7 }, { model: null }];
  for (const w of wrong) await expectStatus(`wrong field ${JSON.stringify(w).slice(0, 70)}`, post('/v1/chat/completions', chat(w)), 400);
  await expectStatus('embeddings: encoding_format', post('/v1/embeddings', JSON.stringify({ model, input: 'x', encoding_format: 'hex' })), 400);
  await expectStatus('embeddings: dimensions', post('/v1/embeddings', JSON.stringify({ model, input: 'x', dimensions: 3 })), 400);
  await expectStatus('completions: suffix', post('/v1/completions', JSON.stringify({ model, prompt: 'x', suffix: 'y' })), 400);
  await expectStatus('completions: best_of', post('/v1/completions', JSON.stringify({ model, prompt: 'x', best_of: 3 })), 400);
  await expectStatus('completions: prompt of floats', post('/v1/completions', JSON.stringify({ model, prompt: [1.5] })), 400);
  // more messages than the context has tokens (--ctx 256) cannot fit: refused before the template renders them
  const many = Array.from({ length: 300 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: 'a' }));
  const r = await raw(post('/v1/chat/completions', JSON.stringify({ model, messages: many, max_tokens: 1 })));
  const e = JSON.parse(dechunk(r.head, r.body)).error;
  check(r.status === 400 && e.code === 'context_length_exceeded' && e.message.includes('300 messages'),
    `300 messages with a context of 256: 400 before rendering (${r.status} ${e.message})`);
  // 20 prompts x n 16 is more than the queue (--max-queue 256) ever holds: a 400, not a 503 that invites retries
  await expectStatus('completions: more choices than the queue holds', post('/v1/completions', JSON.stringify({ model, prompt: Array(20).fill('x'), n: 16, max_tokens: 1 })), 400);
});

await step('http', async () => {
  await expectStatus('unknown route', 'GET /v2/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', 404);
  await expectStatus('GET on a POST route', 'GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', 405);
  await expectStatus('DELETE /v1/models', 'DELETE /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', 405);
  await expectStatus('POST /health', 'POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}', 405);
  for (const path of ['/health', '/v1/models']) {
    const r = await raw(`HEAD ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
    check(r.status === 200 && r.body.length === 0, `HEAD ${path}: 200 without a body (${r.status}, ${r.body.length} bytes)`);
  }
  await expectStatus('a body over --max-body (Content-Length)', `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${64 << 20}\r\nConnection: close\r\n\r\n{`, 413);
  const big = 'x'.repeat(100000);
  const chunked = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n` +
    `${big.length.toString(16)}\r\n${big}\r\n0\r\n\r\n`;
  await expectStatus('a chunked body over --max-body', chunked, 413);
  const g = await raw('HELLO THERE\r\n\r\n', { ms: 5000 });
  check(g.status >= 400 && g.status < 500, `garbage that is not HTTP: ${g.status}`);
  const h = await raw(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(200000)}\r\nConnection: close\r\n\r\n`, { ms: 5000 });
  check(h.status === 431 || h.status === 413 || h.status === 400 || h.closed, `a 200 kB header is refused (${h.status})`);
  // two requests on one keep-alive connection
  const two = await raw('GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  check((two.head + two.body).split('HTTP/1.1 200').length === 3, 'two pipelined requests on one connection');
});

await step('slow and idle clients', async () => {
  // headers that never end, a body that never comes, 200 idle sockets: the server goes on answering
  const stalled = [];
  const a = net.connect(Number(url.port), url.hostname);
  a.on('error', () => {});
  a.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le');
  const b = net.connect(Number(url.port), url.hostname);
  b.on('error', () => {});
  b.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"model":');
  let bClosed = false;
  b.on('close', () => { bClosed = true; });
  for (let i = 0; i < 200; i++) {
    const s = net.connect(Number(url.port), url.hostname);
    s.on('error', () => {});
    stalled.push(s);
  }
  await sleep(300);
  const t0 = Date.now();
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', body: chat({ temperature: 0 }), headers: { 'content-type': 'application/json' } });
  check(r.status === 200 && (await r.json()).choices.length === 1, `a request is served beside stalled clients (${Date.now() - t0} ms)`);
  for (let t = 0; t < 100 && !bClosed; t++) await sleep(100); // --timeout 3
  check(bClosed, 'a client that stops sending its body is disconnected after --timeout');
  for (const s of [a, ...stalled]) s.destroy();
});

await step('clients that send a byte at a time', async () => {
  // never idle for --timeout 3, but the request is not whole after --request-timeout 5: closed, headers or body
  const drip = (head, unit) => {
    const s = net.connect(Number(url.port), url.hostname);
    const o = { closed: 0, t0: Date.now() };
    s.on('error', () => {});
    s.on('close', () => { o.closed = Date.now(); });
    s.write(head);
    o.timer = setInterval(() => { if (!o.closed) s.write(unit); }, 250);
    o.sock = s;
    return o;
  };
  const h = drip('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ', 'a');
  const b = drip('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n{', ' ');
  // on a kept-alive connection, a request every 2 s for 8 s: each has its own deadline, from the previous reply
  const k = net.connect(Number(url.port), url.hostname);
  let got = '';
  k.on('error', () => {});
  k.on('data', (d) => { got += d.toString('latin1'); });
  for (let i = 0; i < 4; i++) {
    k.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
    await sleep(2000);
  }
  k.destroy();
  check(got.split('HTTP/1.1 200').length === 5, `four requests 2 s apart on one connection are all answered (${got.split('HTTP/1.1 200').length - 1})`);
  for (let t = 0; t < 120 && !(h.closed && b.closed); t++) await sleep(100);
  for (const [o, what] of [[h, 'headers'], [b, 'body']]) {
    clearInterval(o.timer);
    o.sock.destroy();
    const took = (o.closed - o.t0) / 1000;
    check(o.closed && took >= 4.5 && took < 8, `a client that drips its ${what} is closed after --request-timeout 5 (${o.closed ? took.toFixed(1) + ' s' : 'still open'})`);
  }
});

await step('client leaves mid-stream', async () => {
  const m0 = await metrics(base);
  const got = await new Promise((resolve) => { // leaves at its first chunk
    const sock = net.connect(Number(url.port), url.hostname);
    let text = '';
    sock.on('error', () => {});
    sock.on('data', (d) => {
      text += d.toString('latin1');
      if (text.includes('data: ')) {
        sock.destroy();
        resolve(text);
      }
    });
    sock.write(post('/v1/chat/completions', chat({ max_tokens: 32, stream: true, temperature: 0, ignore_eos: true })));
  });
  const m = await waitMetrics(base, (x) => x.gemma4c_generations_cancelled_total > m0.gemma4c_generations_cancelled_total &&
    x.gemma4c_requests_running === 0);
  check(got.includes('data: ') && m.gemma4c_generations_cancelled_total > m0.gemma4c_generations_cancelled_total &&
    m.gemma4c_requests_running === 0, 'a raw client that closes mid-stream cancels its generation');
});

// ------------------------------------------------------------------ fuzz
let seed = 12345;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const pick = (a) => a[rnd(a.length)];
const randomValue = (d = 0) => {
  switch (rnd(d > 2 ? 6 : 8)) {
    case 0: return null;
    case 1: return rnd(2) === 0;
    case 2: return pick([0, -1, 1, 2, 7, 1e9, -1e9, 2147483648, 0.5, -0.0001, 1e300]);
    case 3: return pick(['', 'x', 'tolstoy-tiny', 'user', 'assistant', 'tool', 'text', 'image_url', 'function', 'data:,', '\u00e9\u4e2d', 'a'.repeat(300)]);
    case 4: return [];
    case 5: return {};
    case 6: return Array.from({ length: rnd(4) }, () => randomValue(d + 1));
    default: return Object.fromEntries(Array.from({ length: rnd(4) }, () => [pick(['role', 'content', 'type', 'text', 'name', 'x', 'function', 'arguments']), randomValue(d + 1)]));
  }
};
const seeds = [
  ['/v1/chat/completions', { model, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: [{ type: 'text', text: 'hi' }] }], max_tokens: 1, temperature: 0 }],
  ['/v1/chat/completions', { model, messages: [{ role: 'user', content: 'w' }, { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{"a":1}' } }] }, { role: 'tool', tool_call_id: 'c', content: 'ok' }], tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'number' } } } } }], max_tokens: 1, stream: true }],
  ['/v1/completions', { model, prompt: [2, 100, 200], max_tokens: 1, logprobs: 2, n: 2, stop: ['x'] }],
  ['/v1/completions', { model, prompt: 'War', max_tokens: 1, stream: true, stream_options: { include_usage: true } }],
  ['/v1/embeddings', { model, input: ['a', [2, 3]], encoding_format: 'base64' }],
];
// Paths to every value of a JSON document.
function paths(v, p = []) {
  const out = [p];
  if (v && typeof v === 'object') for (const k of Object.keys(v)) out.push(...paths(v[k], [...p, k]));
  return out;
}
function mutate(doc) {
  const d = JSON.parse(JSON.stringify(doc));
  const n = 1 + rnd(3);
  for (let i = 0; i < n; i++) {
    const ps = paths(d).filter((p) => p.length);
    const p = pick(ps);
    let o = d;
    for (const k of p.slice(0, -1)) o = o[k];
    const k = p[p.length - 1];
    switch (rnd(3)) {
      case 0: o[k] = randomValue(); break;
      case 1: if (Array.isArray(o)) o.splice(Number(k), 1); else delete o[k]; break;
      default: if (!Array.isArray(o)) o[pick(['n', 'stream', 'logprobs', 'top_logprobs', 'seed', 'stop', 'logit_bias', 'echo', 'tools', 'tool_choice', 'response_format', 'max_tokens', 'input', 'prompt', 'messages'])] = randomValue();
    }
  }
  let text = JSON.stringify(d);
  const b = Buffer.from(text, 'utf8');
  switch (rnd(6)) { // sometimes break the bytes too
    case 0: return b.subarray(0, rnd(b.length + 1));
    case 1: { const c = Buffer.from(b); for (let i = 0; i < 1 + rnd(4); i++) c[rnd(c.length)] = rnd(256); return c; }
    default: return b;
  }
}

await step('fuzz', async () => {
  const counts = {};
  let bad = 0, firstBad = '';
  let next = 0;
  async function worker() {
    while (next < fuzzCount) {
      next++;
      const [path, doc] = pick(seeds);
      const body = mutate(doc);
      const r = await raw(post(path, body), { ms: 60000 });
      counts[r.status] = (counts[r.status] || 0) + 1;
      const text = dechunk(r.head, r.body);
      const ok = (r.status === 200 && (text.startsWith('{') || text.includes('data: [DONE]'))) ||
        (r.status >= 400 && r.status < 500 && isErrorShape(text));
      if (!ok) {
        bad++;
        if (bad <= 3) console.log(`  not a 200 or a 4xx in shape: ${r.status} ${body.toString('latin1')} -> ${text.slice(-400)}`);
        if (!firstBad) firstBad = `${r.status} ${body.toString('latin1').slice(0, 200)} -> ${text.slice(0, 200)}`;
      }
    }
  }
  const t0 = Date.now();
  await Promise.all(Array.from({ length: 8 }, worker));
  check(bad === 0, `fuzz: ${fuzzCount} mutated requests in ${((Date.now() - t0) / 1000).toFixed(1)} s, each a 200 or a 4xx in OpenAI's shape (statuses ${JSON.stringify(counts)})${bad ? `; ${bad} not, first: ${firstBad}` : ''}`);
  const h = await fetch(`${base}/health`);
  check(h.status === 200, 'the server is healthy after the fuzz run');
});

await step('SIGTERM drains', async () => {
  // a client still sending its body, one byte at a time (never idle for --timeout): it has nothing to lose, so the
  // drain does not wait for it
  const slow = net.connect(Number(url.port), url.hostname);
  slow.on('error', () => {});
  let slowClosed = 0;
  slow.on('close', () => { slowClosed = Date.now(); });
  slow.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{');
  const drip = setInterval(() => slow.write(' '), 300);
  const ac = new AbortController();
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, prompt: 'Pierre', max_tokens: 24, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true } }),
  });
  const reader = r.body.getReader();
  let text = '', signalled = false;
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    text += Buffer.from(value).toString('utf8');
    if (!signalled && text.includes('"text"')) {
      signalled = true;
      process.kill(pid, 'SIGTERM');
      await sleep(200);
      const refused = await new Promise((resolve) => {
        const s = net.connect(Number(url.port), url.hostname);
        s.on('error', () => resolve(true));
        s.on('connect', () => { s.destroy(); resolve(false); });
      });
      check(refused, 'while draining, new connections are refused');
    }
  }
  const usage = text.split('\n').filter((l) => l.includes('"usage":{')).map((l) => JSON.parse(l.slice(6)).usage)[0];
  check(signalled && text.includes('data: [DONE]') && usage && usage.completion_tokens === 24,
    `the stream in flight at SIGTERM ends whole (${usage && usage.completion_tokens} tokens)`);
  const ended = Date.now();
  for (let t = 0; t < 100 && !slowClosed; t++) await sleep(100);
  clearInterval(drip);
  slow.destroy();
  check(slowClosed && slowClosed - ended < 5000,
    `the server stops at once once the stream is over, not waiting for a client still sending its body (${slowClosed ? slowClosed - ended : '>10000'} ms)`);
});

done();
