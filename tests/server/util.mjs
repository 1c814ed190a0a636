// What the server's node scripts share: ok/FAIL lines, reading reference.safetensors, /metrics.
import fs from 'node:fs';

let failed = 0;
export function check(cond, what) {
  console.log(`${cond ? 'ok  ' : 'FAIL'} ${what}`);
  if (!cond) failed++;
  return cond;
}
export function done() {
  process.exit(failed ? 1 : 0);
}
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Runs fn; a throw is a failure with its message (the rest of the script goes on).
export async function step(what, fn) {
  try {
    await fn();
  } catch (e) {
    check(false, `${what}: ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`);
  }
}

// The tensors of a .safetensors file: {name: {dtype, shape, data (Float32Array | BigInt64Array)}}.
export function readSafetensors(path) {
  const buf = fs.readFileSync(path);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const out = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [a, b] = t.data_offsets;
    const bytes = buf.subarray(8 + n + a, 8 + n + b);
    const copy = new Uint8Array(bytes).buffer; // aligned
    const data = t.dtype === 'F32' ? new Float32Array(copy) : t.dtype === 'I64' ? new BigInt64Array(copy) : null;
    out[name] = { dtype: t.dtype, shape: t.shape, data };
  }
  return out;
}

// log-softmax of a row.
export function logSoftmax(row) {
  let mx = -Infinity;
  for (const v of row) if (v > mx) mx = v;
  let sum = 0;
  for (const v of row) sum += Math.exp(v - mx);
  const lse = mx + Math.log(sum);
  return Float64Array.from(row, (v) => v - lse);
}

// The numeric samples of /metrics: {"name{labels}": value}.
export async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

// Polls /metrics until pred(m) holds (or about `ms` passed); returns the last sample.
export async function waitMetrics(base, pred, ms = 20000) {
  let m;
  for (let t = 0; t < ms; t += 100) {
    m = await metrics(base);
    if (pred(m)) return m;
    await sleep(100);
  }
  return m;
}
