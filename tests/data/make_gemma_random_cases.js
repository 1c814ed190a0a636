// Writes tests/data/gemma_random_cases.json: random texts (special and added tokens, whitespace
// runs, many scripts, emoji, control characters) and random id lists (byte tokens, specials),
// with what Hugging Face `tokenizers` returns for them on shared/tokenizer/tokenizer.json.
// Deterministic (xorshift seed). Needs the Node binding of the library:
//   (cd /tmp/hf && npm install tokenizers@0.23.2)
//   NODE_PATH=/tmp/hf/node_modules node tests/data/make_gemma_random_cases.js [N] [SEED] > tests/data/gemma_random_cases.json
'use strict';
const { Tokenizer } = require('tokenizers');
const tokPath = process.env.G4_TOKENIZER || require('path').join(__dirname, '../../../shared/tokenizer/tokenizer.json');
const N = Number(process.argv[2] || 400), seed0 = Number(process.argv[3] || 2026);
let s = seed0 >>> 0;
function rnd() { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s / 4294967296; }
function ri(n) { return Math.floor(rnd() * n); }
const pieces = ['<bos>','<eos>','<pad>','<unk>','<mask>','<|turn>','<turn|>','<|channel>','<channel|>','<|"|>','<|image|>',
 '<unused0>','<unused12>','<unused999>','<unused','<table>','</td>','<b>','<br>','[multimodal]',
 '\n','\n\n','\n\n\n\n\n','\r\n','\t','\t\t\t',' ','  ','     ','\u2581','\u2581\u2581','\u2581 \u2581',
 'the','The',' the',' and',' Pierre','Natasha','http://x.org/a?b=c','1234567890','3.14','!!!','...','—','“','”','’',
 'naïve','Straße','ﬁ','Москва','日本語','中文','한국어','مرحبا','हिन्दी','ไทย','😀','👍🏽','👨\u200d👩\u200d👧','🇫🇷','\u0301','e\u0301',
 '\u0000','\u0001','\u007f','\u00a0','\u200b','\u2028','\ue000','\uffff','\ud83e\udd80','𝔘𝔫','<0x41>','<0xZZ>','▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁',
 '{"a": [1, 2]}','def f(x):\n    return x','a'.repeat(50),'ab '.repeat(20),' '.repeat(40),'\n'.repeat(40)];
function randChar() {
  const r = rnd();
  if (r < 0.5) return String.fromCharCode(32 + ri(95));
  if (r < 0.7) return String.fromCharCode(0xA0 + ri(0x2000));
  if (r < 0.85) { const c = 0x3000 + ri(0xA000); return (c >= 0xD800 && c < 0xE000) ? 'x' : String.fromCharCode(c); }
  if (r < 0.95) return String.fromCodePoint(0x10000 + ri(0x20000));
  return String.fromCharCode(ri(32));
}
function randText() {
  let t = ''; const k = ri(12);
  for (let i = 0; i < k; i++) {
    if (rnd() < 0.55) t += pieces[ri(pieces.length)];
    else { const m = 1 + ri(8); for (let j = 0; j < m; j++) t += randChar(); }
  }
  return t;
}
(async () => {
  const tok = Tokenizer.fromFile(tokPath);
  const vs = 262144;
  const enc = [], dec = [];
  for (let i = 0; i < N; i++) {
    let text = randText();
    if (i % 50 === 49) for (let k = 0; k < 60; k++) text += randText();
    const special = rnd() < 0.5;
    const e = await tok.encode(text, null, { addSpecialTokens: special });
    enc.push({ text, add_special_tokens: special, ids: Array.from(e.getIds()) });
  }
  for (let i = 0; i < N; i++) {
    const ids = []; const k = ri(20);
    for (let j = 0; j < k; j++) {
      const r = rnd();
      if (r < 0.35) ids.push(3 + 235 + ri(256)); // around byte tokens (238..493)
      else if (r < 0.5) ids.push(ri(300));
      else if (r < 0.55) ids.push(255968 + ri(30));
      else if (r < 0.6) ids.push(258880 + ri(5));
      else ids.push(ri(vs));
    }
    const skip = rnd() < 0.5;
    dec.push({ ids, skip_special_tokens: skip, text: await tok.decode(ids, skip) });
  }
  const version = require('tokenizers/package.json').version;
  process.stdout.write(JSON.stringify({ generator: 'tests/data/make_gemma_random_cases.js', library: 'tokenizers (Node binding) ' + version,
                                        seed: seed0, encode: enc, decode: dec }) + '\n');
})();
