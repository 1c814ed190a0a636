// A bounded loopback load test (tests/test_server_load.sh, bench/server_load.sh): C concurrent clients send
// R requests each (chat plain and streamed, completions), every 8th stream cancelled after its first token.
// Checks: no error but the cancellations, every reply complete, the server's resident memory back to its
// baseline afterwards (measured after a warm-up that used every sequence once). Prints p50/p99 latency,
// time to first token (streams) and generated tokens per second.
//   node load.mjs BASE_URL SERVER_PID CLIENTS REQUESTS MAX_TOKENS [RSS_SLACK_MB]
import fs from 'node:fs';
import OpenAI from 'openai';
import { check, done, metrics, sleep, waitMetrics } from './util.mjs';

const [base, pidArg, clientsArg, requestsArg, maxTokArg, slackArg] = process.argv.slice(2);
const pid = Number(pidArg), C = Number(clientsArg), R = Number(requestsArg), maxTokens = Number(maxTokArg);
const slackMb = Number(slackArg ?? 16);
const model = 'tolstoy-tiny';
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 600000 });
const rssKb = () => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]);
const pct = (a, p) => a.length ? a[Math.min(a.length - 1, Math.floor(p * a.length))] : NaN;
const words = ['Pierre', 'Natasha', 'Moscow', 'the war', 'Andrew', 'a ball', 'the count', 'Borodino'];

async function one(c, i) {
  const kind = (c + i) % 3; // 0 chat, 1 chat streamed, 2 completions
  const cancel = kind === 1 && (c * R + i) % 8 === 1;
  const messages = [{ role: 'user', content: `Tell me about ${words[(c * 7 + i) % words.length]}.` }];
  const t0 = performance.now();
  let ttft = null, tokens = 0;
  if (kind === 0) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: maxTokens, seed: c * 1000 + i });
    tokens = r.usage.completion_tokens;
    if (!(r.choices[0].finish_reason === 'length' ? tokens === maxTokens : tokens > 0)) throw new Error(`bad usage ${tokens}`);
  } else if (kind === 1) {
    const ac = new AbortController();
    // a stream to cancel asks for many tokens, so the server is still generating when the abort reaches it
    // (one of maxTokens could end before that, and the server would rightly count no cancellation)
    const s = await client.chat.completions.create({ model, messages, max_tokens: cancel ? 128 : maxTokens, seed: c,
      stream: true, stream_options: { include_usage: true }, ...(cancel ? { ignore_eos: true } : {}) }, { signal: ac.signal });
    let finished = false;
    try {
      for await (const ch of s) {
        if (ch.choices[0]?.delta?.content && ttft === null) {
          ttft = performance.now() - t0;
          if (cancel) ac.abort();
        }
        if (ch.choices[0]?.finish_reason) finished = true;
        if (ch.usage) tokens = ch.usage.completion_tokens;
      }
    } catch (e) {
      if (!cancel) throw e;
      return { cancelled: true, ms: performance.now() - t0, ttft, tokens: 0 };
    }
    // (the client's iterator ends quietly on an abort: a cancellation is an abort before the finish chunk)
    if (cancel && !finished) return { cancelled: true, ms: performance.now() - t0, ttft, tokens: 0 };
    if (!finished || tokens <= 0) throw new Error('a stream ended without its finish chunk or usage');
  } else {
    const r = await client.completions.create({ model, prompt: messages[0].content, max_tokens: maxTokens, ignore_eos: true });
    tokens = r.usage.completion_tokens;
    if (tokens !== maxTokens) throw new Error(`completions made ${tokens} tokens`);
  }
  return { ms: performance.now() - t0, ttft, tokens };
}

// warm-up: every sequence and code path once, then the baseline
const m0 = await metrics(base), tm0 = performance.now();
await Promise.all(Array.from({ length: 8 }, (_, i) => one(i, 0).catch(() => null)));
await waitMetrics(base, (m) => m.gemma4c_requests_running === 0 && m.gemma4c_requests_queued === 0);
await sleep(500);
const baseline = rssKb();

const results = [], errors = [];
const t0 = performance.now();
await Promise.all(Array.from({ length: C }, async (_, c) => {
  for (let i = 0; i < R; i++) {
    try {
      results.push(await one(c, i));
    } catch (e) {
      errors.push(`${e.status ?? ''} ${e.message}`);
    }
  }
}));
const wall = (performance.now() - t0) / 1000;
const m = await waitMetrics(base, (x) => x.gemma4c_requests_running === 0 && x.gemma4c_requests_queued === 0);
await sleep(1000); // the engine trims its heap when it goes idle
const after = rssKb();

const cancelled = results.filter((r) => r.cancelled).length;
const lat = results.filter((r) => !r.cancelled).map((r) => r.ms).sort((a, b) => a - b);
const ttfts = results.filter((r) => r.ttft !== null).map((r) => r.ttft).sort((a, b) => a - b);
const tokens = m.gemma4c_generated_tokens_total - m0.gemma4c_generated_tokens_total;
check(errors.length === 0, `${C} clients x ${R} requests: ${results.length} answered, ${cancelled} cancelled on purpose, ${errors.length} errors${errors.length ? ': ' + errors.slice(0, 3).join('; ') : ''}`);
check(m.gemma4c_requests_running === 0 && m.gemma4c_requests_queued === 0, 'nothing left running or queued');
check(m.gemma4c_generations_cancelled_total - m0.gemma4c_generations_cancelled_total >= cancelled,
  `the server cancelled the ${cancelled} abandoned streams`);
check(after <= baseline + slackMb * 1024,
  `resident memory back to its baseline: ${(baseline / 1024).toFixed(1)} MB before, ${(after / 1024).toFixed(1)} MB after (slack ${slackMb} MB)`);
const d = (k) => m[k] - m0[k];
const steps = d('gemma4c_batch_steps_total'), stepS = d('gemma4c_batch_step_seconds_total');
const modelS = d('gemma4c_model_seconds_total'), busyS = d('gemma4c_worker_busy_seconds_total');
const since = (performance.now() - tm0) / 1000; // the warm-up's steps count too
check(steps > 0 && modelS > 0 && modelS <= stepS + 1e-5 && stepS <= busyS + 1e-5 && busyS <= since + 2, // (a step begun before m0)
  `the engine's time: ${steps} steps, ${stepS.toFixed(2)} s in them, ${modelS.toFixed(2)} s of it in the model, ` +
  `${busyS.toFixed(2)} s busy (of ${since.toFixed(1)} s)`);
console.log(`load: ${C} clients x ${R} requests, max_tokens ${maxTokens}: ${wall.toFixed(1)} s, ` +
  `latency p50 ${pct(lat, 0.5).toFixed(0)} ms p99 ${pct(lat, 0.99).toFixed(0)} ms, ` +
  `first token p50 ${pct(ttfts, 0.5).toFixed(0)} ms p99 ${pct(ttfts, 0.99).toFixed(0)} ms, ` +
  `${tokens} tokens generated, ${(tokens / wall).toFixed(1)} tokens/s`);
done();
