// Writes tests/data/tokenizer_cases.json: small tokenizer.json files that exercise what the
// Gemma file does not (legacy merges, added-token flags, Split behaviors, unk handling,
// subword prefixes, Strip/no decoder, templates) together with what Hugging Face
// `tokenizers` returns for them. The C test (tests/test_tokenizer.c) checks ours against it.
//
// Run with the official Node binding of the same library the fixtures were made with:
//   (cd /tmp/hf && npm install tokenizers@0.23.2)
//   NODE_PATH=/tmp/hf/node_modules node tests/data/make_tokenizer_cases.js > tests/data/tokenizer_cases.json
'use strict';
const { Tokenizer } = require('tokenizers');

const U = '\u2581';

function bpe(vocabList, merges, opts = {}) {
  const vocab = {};
  vocabList.forEach((t, i) => { if (!(t in vocab)) vocab[t] = i; });
  return Object.assign({
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false,
    vocab, merges,
  }, opts);
}

function added(id, content, flags = {}) {
  return Object.assign({ id, content, single_word: false, lstrip: false, rstrip: false,
                         normalized: false, special: false }, flags);
}

function tokenizer(model, extra = {}) {
  return Object.assign({ version: '1.0', truncation: null, padding: null, added_tokens: [],
                         normalizer: null, pre_tokenizer: null, post_processor: null,
                         decoder: null, model }, extra);
}

const bytes = [];
for (let b = 0; b < 256; b++) bytes.push('<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>');

const abcVocab = ['<unk>', 'a', 'b', 'c', 'd', 'e', 'ab', 'bc', 'cd', 'abc', 'bcd', 'abcd', 'de', 'cde'];
const abcPairs = [['a', 'b'], ['b', 'c'], ['c', 'd'], ['ab', 'c'], ['bc', 'd'], ['abc', 'd'], ['d', 'e'],
                  ['c', 'de'], ['b', 'c']];
const abcTexts = ['abcde', 'dcba', 'abxcd', 'xxab', 'bcdbcd', 'cde', 'aabbccdde', 'e', ''];

const cases = [];
function add(name, tok, texts, decodes = []) { cases.push({ name, tok, texts, decodes }); }

add('merges as pairs, repeated pair, unk not fused',
    tokenizer(bpe(abcVocab, abcPairs, { unk_token: '<unk>' })), abcTexts, [[1, 2, 0, 3], [11, 12]]);
add('merges as "a b" strings',
    tokenizer(bpe(abcVocab, abcPairs.map(p => p.join(' ')), { unk_token: '<unk>' })), abcTexts);
add('fused unknowns',
    tokenizer(bpe(abcVocab, abcPairs, { unk_token: '<unk>', fuse_unk: true })), ['xyzab', 'axyb', 'ab\u00e9\u00e9c', 'xx']);
add('no unk token: unknown characters dropped',
    tokenizer(bpe(abcVocab.slice(1), abcPairs)), ['axb', 'xyz', 'abc\u00e9d']);
add('spaces inside pair merges',
    tokenizer(bpe(['a', ' ', 'b', 'c', 'a ', 'a b', 'a bc'], [['a', ' '], ['a ', 'b'], ['a b', 'c']])),
    ['a bc', 'a b a bc', ' a  b']);

// byte fallback where only some bytes exist: a character falls back only if all of its bytes do
add('partial byte fallback',
    tokenizer(bpe(['<unk>', 'a', 'b', '<0xC3>', '<0xA9>', '<0xE2>', '<0x82>'], [], { unk_token: '<unk>', byte_fallback: true, fuse_unk: true }),
              { decoder: { type: 'Sequence', decoders: [{ type: 'ByteFallback' }, { type: 'Fuse' }] } }),
    ['a\u00e9b', 'a\u20acb', '\u00e9\u20ac\u20ac', '\u20ac\u00e9'],
    [[3, 4], [3, 1, 4], [5, 6], [5, 6, 1], [1, 3]]);

// Llama-like: Prepend + Replace normalizer, all bytes, Strip decoder, template with BOS/EOS,
// added tokens with every flag
const llamaVocab = ['<unk>', '<s>', '</s>'].concat(bytes, [U, 'h', 'e', 'l', 'o', 'w', 'r', 'd', 'a', 'b', 'x', 'y', 'z', 'i',
  U + 'h', U + 'he', U + 'hel', U + 'hell', U + 'hello', U + 'w', U + 'wo', U + 'wor', U + 'worl', U + 'world', 'll', 'he']);
const llamaMerges = [[U, 'h'], [U + 'h', 'e'], [U + 'he', 'l'], [U + 'hel', 'l'], [U + 'hell', 'o'], [U, 'w'], [U + 'w', 'o'],
  [U + 'wo', 'r'], [U + 'wor', 'l'], [U + 'worl', 'd'], ['l', 'l'], ['h', 'e']];
const n0 = llamaVocab.length;
const llama = tokenizer(bpe(llamaVocab, llamaMerges, { unk_token: '<unk>', byte_fallback: true, fuse_unk: true }), {
  added_tokens: [
    added(0, '<unk>', { special: true }), added(1, '<s>', { special: true }), added(2, '</s>', { special: true }),
    added(n0, '[L]', { lstrip: true }), added(n0 + 1, '[R]', { rstrip: true }), added(n0 + 2, '[W]', { single_word: true }),
    added(n0 + 3, 'hello', { normalized: true }), added(n0 + 4, 'x y', { normalized: true }),
    added(n0 + 5, '<mask>', { lstrip: true, rstrip: true, special: true }), added(n0 + 6, '[N]', { single_word: true, normalized: true }),
  ],
  normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: U }, { type: 'Replace', pattern: { String: ' ' }, content: U }] },
  post_processor: { type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
    pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] }, '</s>': { id: '</s>', ids: [2], tokens: ['</s>'] } } },
  decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: U }, content: ' ' }, { type: 'ByteFallback' },
    { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
});
add('llama-like: added token flags, normalized added tokens, template, Strip', llama,
    ['hello world', ' hello', 'hellohello', ' [L] a', 'a   [L]b', 'a [R]   b', '[R]', 'a[W]b', 'a [W] b', '[W]', '\u00e9[W]',
     'x y z', 'ax yb', '<s>hi</s>', '<mask>', 'a  <mask>  b', 'h\u00e9llo', '', ' ', '  ', '[N]a', 'a [N] b', 'zz[N]',
     'a [L][R] b', 'world\u20ac', 'hi\ud83d\ude00'],
    [[n0 + 3, n0 + 3], [1, n0 + 4, 2], [1, 3 + 0xC3, 3 + 0xA9, 2], [3 + 0xC3, 1, 3 + 0xA9], [3 + 0xF0, 3 + 0x9F], [n0 + 5, n0 + 6]]);

// Split pre-tokenizer behaviors: without the split "a-b" would merge across '-'
const splitVocab = ['<unk>', 'a', 'b', '-', 'a-', '-b', 'a-b', '--', 'ab', 'b-', '-a'];
const splitMerges = [['a', '-'], ['-', 'b'], ['a-', 'b'], ['-', '-'], ['a', 'b'], ['b', '-'], ['-', 'a']];
for (const behavior of ['Removed', 'Isolated', 'MergedWithPrevious', 'MergedWithNext', 'Contiguous']) {
  add('Split "-" ' + behavior,
      tokenizer(bpe(splitVocab, splitMerges, { unk_token: '<unk>' }),
                { pre_tokenizer: { type: 'Split', pattern: { String: '-' }, behavior, invert: false } }),
      ['a-b', 'a--b', '-a-', 'ab-ba--', '---', 'ab', '-']);
}
add('Split sequence',
    tokenizer(bpe(splitVocab, splitMerges, { unk_token: '<unk>' }),
              { pre_tokenizer: { type: 'Sequence', pretokenizers: [
                { type: 'Split', pattern: { String: '-' }, behavior: 'MergedWithNext', invert: false },
                { type: 'Split', pattern: { String: 'b' }, behavior: 'Isolated', invert: false }] } }),
    ['a-b', 'ab-ba--', 'bab-b']);

add('ignore_merges',
    tokenizer(bpe(['<unk>', 'a', 'b', 'd', 'ab', 'abd', 'bd'], [['a', 'b'], ['b', 'd']], { unk_token: '<unk>', ignore_merges: true })),
    ['abd', 'abdd', 'ab', 'bd', 'dab']);
add('continuing_subword_prefix and end_of_word_suffix',
    tokenizer(bpe(['<unk>', 'a', '##b', '##c</w>', 'ab', 'abc</w>', 'c', 'a</w>', '##a', 'c</w>', '##b</w>', 'ab</w>'],
                  [['a', '##b'], ['ab', '##c</w>'], ['a', '##b</w>']], { unk_token: '<unk>', continuing_subword_prefix: '##', end_of_word_suffix: '</w>' })),
    ['abc', 'ab', 'a', 'c', 'cab', 'abab']);
add('Replace normalizers chained',
    tokenizer(bpe(['<unk>', 'a', 'b', 'c', 'd', 'X', 'dd'], [['d', 'd']], { unk_token: '<unk>' }),
              { normalizer: { type: 'Sequence', normalizers: [{ type: 'Replace', pattern: { String: 'ab' }, content: 'c' },
                                                              { type: 'Replace', pattern: { String: 'c' }, content: 'dd' }] } }),
    ['aab', 'abab', 'aba', 'cab', 'xyz']);

(async () => {
  const out = { generator: 'tests/data/make_tokenizer_cases.js', library: 'tokenizers (Node binding) ' + require('tokenizers/package.json').version, cases: [] };
  for (const c of cases) {
    const json = JSON.stringify(c.tok);
    const tok = Tokenizer.fromString(json);
    const entry = { name: c.name, tokenizer: c.tok, encode: [], decode: [] };
    const idLists = [];
    for (const text of c.texts) {
      for (const special of [false, true]) {
        const e = await tok.encode(text, null, { addSpecialTokens: special });
        const ids = Array.from(e.getIds());
        entry.encode.push({ text, add_special_tokens: special, ids });
        idLists.push(ids);
      }
    }
    for (const ids of idLists.concat(c.decodes)) {
      for (const skip of [false, true]) {
        entry.decode.push({ ids, skip_special_tokens: skip, text: await tok.decode(ids, skip) });
      }
    }
    out.cases.push(entry);
  }
  process.stdout.write(JSON.stringify(out) + '\n');
})().catch(e => { console.error(e); process.exit(1); });
