"""gemma4c: Python bindings for libgemma4c, an inference engine for Google's Gemma 4 models.

ctypes over the shared library (include/gemma4c.h); no compiled extension. The library is
found as $GEMMA4C_LIBRARY, else libgemma4c.so.0 on the loader's path (an installed library,
or LD_LIBRARY_PATH).

    import gemma4c
    model = gemma4c.Model("models/tolstoy-tiny")
    for piece in model.chat([{"role": "user", "content": "Who is Pierre?"}], stream=True):
        print(piece, end="", flush=True)

Sampling keywords (generate, chat): temperature, top_k, top_p, min_p, repetition_penalty,
presence_penalty, frequency_penalty, seed, logit_bias ({id: bias}); unset ones take the model's
generation_config.json defaults. max_tokens, stop (strings), ignore_eos.
"""
import codecs
import ctypes
import json
import os
import weakref

__version__ = "0.1.0"
__all__ = ["Model", "Stream", "Reply", "Error", "library_version"]


class Error(RuntimeError):
    """A failure reported by the library (its one-line message)."""


def _find_library():
    names = [os.environ["GEMMA4C_LIBRARY"]] if os.environ.get("GEMMA4C_LIBRARY") else ["libgemma4c.so.0", "libgemma4c.so"]
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            last = e
    raise ImportError("gemma4c: cannot load %s (%s): install the library (cmake --install) or set "
                      "GEMMA4C_LIBRARY" % (" or ".join(names), last))


_lib = _find_library()

# ----------------------------------------------------------------- the C types (gemma4c.h)
c_int, c_int32, c_float, c_size_t, c_void_p, c_char_p = (ctypes.c_int, ctypes.c_int32, ctypes.c_float,
                                                          ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p)
P = ctypes.POINTER
PROGRESS_FN = ctypes.CFUNCTYPE(None, c_float, c_char_p, c_void_p)


class _Error(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 512)]


class _LoadParams(ctypes.Structure):
    _fields_ = [("n_threads", c_int), ("device", c_char_p), ("progress", PROGRESS_FN), ("progress_user", c_void_p),
                ("random_weights", c_int), ("random_type", c_char_p), ("bf16_activations", c_int),
                ("mmproj", c_char_p)]


class _ContextParams(ctypes.Structure):
    _fields_ = [("n_seq_max", c_int), ("n_ctx", c_int), ("n_batch", c_int), ("kv_type", c_int),
                ("kv_block_size", c_int), ("n_kv_blocks", c_int), ("kv_history", c_int),
                ("n_kv_sliding_blocks", c_int)]


class _Tokens(ctypes.Structure):
    _fields_ = [("ids", P(c_int32)), ("n", c_size_t), ("cap", c_size_t)]


class _ChatMessage(ctypes.Structure):
    _fields_ = [("content", c_void_p), ("thinking", c_void_p), ("tool_calls", c_void_p), ("n_tool_calls", c_int)]


class _SamplerParams(ctypes.Structure):
    _fields_ = [("temperature", c_float), ("top_k", c_int), ("top_p", c_float), ("min_p", c_float),
                ("repetition_penalty", c_float), ("presence_penalty", c_float), ("frequency_penalty", c_float),
                ("penalty_last_n", c_int), ("seed", ctypes.c_uint64), ("bias_ids", P(c_int32)),
                ("bias_values", P(c_float)), ("n_bias", c_int), ("suppress_ids", P(c_int32)), ("n_suppress", c_int)]


class _GenerationParams(ctypes.Structure):
    _fields_ = [("max_new_tokens", c_int), ("sampling", P(_SamplerParams)), ("ignore_eos", c_int),
                ("stop_ids", P(c_int32)), ("n_stop_ids", c_int), ("stop_strings", P(c_char_p)),
                ("n_stop_strings", c_int), ("parse_chat", c_int), ("penalties_output_only", c_int),
                ("logprobs", c_int), ("top_logprobs", c_int), ("json_object", c_int),
                ("drafter", c_void_p), ("n_draft", c_int),
                ("media", c_void_p), ("n_media", c_int), ("grammar", c_void_p)]


class _Event(ctypes.Structure):
    _fields_ = [("kind", c_int), ("token", c_int32), ("text", c_void_p), ("len", c_size_t)]


EVENT_TOKEN, EVENT_TEXT, EVENT_THINKING, EVENT_TOOL_CALL = 0, 1, 2, 3
_FINISH = {0: None, 1: "stop", 2: "length", 3: "cancelled"}


def _fn(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


E = P(_Error)
_version = _fn("g4_version", c_char_p)
_free = _fn("g4_free", None, c_void_p)
_model_load = _fn("g4_model_load", c_int, c_char_p, P(_LoadParams), P(c_void_p), E)
_model_free = _fn("g4_model_free", None, c_void_p)
_drafter_load = _fn("g4_drafter_load", c_int, c_char_p, c_void_p, P(c_void_p), E)
_drafter_free = _fn("g4_drafter_free", None, c_void_p)
_model_vocab_size = _fn("g4_model_vocab_size", c_int, c_void_p)
_model_hidden_size = _fn("g4_model_hidden_size", c_int, c_void_p)
_model_tokenizer = _fn("g4_model_tokenizer", c_void_p, c_void_p)
_model_chat_template = _fn("g4_model_chat_template", c_void_p, c_void_p)
_model_sampler_params = _fn("g4_model_sampler_params", None, c_void_p, P(_SamplerParams))
_context_new = _fn("g4_context_new", c_int, c_void_p, P(_ContextParams), P(c_void_p), E)
_context_free = _fn("g4_context_free", None, c_void_p)
_context_n_ctx = _fn("g4_context_n_ctx", c_int, c_void_p)
_tokenize = _fn("g4_tokenize", c_int, c_void_p, c_char_p, c_size_t, c_int, P(_Tokens), E)
_detokenize = _fn("g4_detokenize", c_int, c_void_p, P(c_int32), c_size_t, c_int, P(c_void_p), P(c_size_t), E)
_embed = _fn("g4_embed", c_int, c_void_p, c_int, P(c_int32), c_int, P(c_float), E)
_chat_new = _fn("g4_chat_new", c_int, c_void_p, c_char_p, P(c_void_p), E)
_chat_free = _fn("g4_chat_free", None, c_void_p)
_chat_start = _fn("g4_chat_start", c_int, c_void_p, c_void_p, c_int, P(_GenerationParams), P(c_void_p), E)
_message_free = _fn("g4_chat_message_free", None, P(_ChatMessage))
_gen_start = _fn("g4_generation_start", c_int, c_void_p, c_int, P(c_int32), c_int, P(_GenerationParams),
                 P(c_void_p), E)
_gen_next = _fn("g4_generation_next", c_int, c_void_p, P(_Event), E)
_gen_cancel = _fn("g4_generation_cancel", None, c_void_p)
_gen_finish = _fn("g4_generation_finish", c_int, c_void_p)
_gen_tokens = _fn("g4_generation_tokens", P(c_int32), c_void_p, P(c_int))
_gen_message = _fn("g4_generation_message", c_int, c_void_p, P(_ChatMessage), E)
_gen_free = _fn("g4_generation_free", None, c_void_p)
_grammar_json_schema = _fn("g4_grammar_json_schema", c_int, c_char_p, P(c_void_p), E)
_grammar_gbnf = _fn("g4_grammar_gbnf", c_int, c_char_p, P(c_void_p), E)
_grammar_free = _fn("g4_grammar_free", None, c_void_p)


class _Grammar:
    """A grammar of the library (g4_grammar), freed with the object: a JSON Schema (a dict) or GBNF text."""

    def __init__(self, schema=None, gbnf=None):
        self.ptr, err = c_void_p(), _Error()
        if gbnf is not None:
            _check(_grammar_gbnf(gbnf.encode("utf-8"), ctypes.byref(self.ptr), ctypes.byref(err)), err)
        else:
            _check(_grammar_json_schema(json.dumps(schema).encode("utf-8"), ctypes.byref(self.ptr),
                                        ctypes.byref(err)), err)

    def __del__(self):
        if _grammar_free and self.ptr:
            _grammar_free(self.ptr)


def library_version():
    """The version of the loaded libgemma4c ("0.1.0")."""
    return _version().decode()


def _check(rc, err):
    if rc < 0:
        raise Error(err.msg.decode("utf-8", "replace"))
    return rc


def _ids_array(ids):
    ids = list(ids)
    return (c_int32 * max(len(ids), 1))(*ids), len(ids)


def _string(ptr):
    return ctypes.string_at(ptr).decode("utf-8") if ptr else ""


class Reply:
    """A finished answer: content, thinking, tool_calls ([{"name", "arguments"}]), tokens (the
    generated ids) and finish_reason ("stop", "length" or "cancelled"). str(reply) is the content."""

    def __init__(self, content, thinking, tool_calls, tokens, finish_reason):
        self.content, self.thinking, self.tool_calls = content, thinking, tool_calls
        self.tokens, self.finish_reason = tokens, finish_reason

    def __str__(self):
        return self.content

    def __repr__(self):
        return "Reply(content=%r, thinking=%r, tool_calls=%r, finish_reason=%r)" % (
            self.content, self.thinking, self.tool_calls, self.finish_reason)


class Stream:
    """The text of a running generation, piece by piece (str). Iterating runs the model; when it
    ends, .reply holds the whole Reply. cancel() (from any thread) or close() stops it early."""

    def __init__(self, model, handle, keep):
        self._model, self._gen, self._keep = model, handle, keep
        self._decode = codecs.getincrementaldecoder("utf-8")("replace")
        self.reply = None

    def __iter__(self):
        return self

    def __next__(self):
        ev, err = _Event(), _Error()
        while self._gen:
            if _check(_gen_next(self._gen, ctypes.byref(ev), ctypes.byref(err)), err) == 0:
                self._finish()
                break
            if ev.kind == EVENT_TEXT:
                piece = self._decode.decode(ctypes.string_at(ev.text, ev.len))
                if piece:
                    return piece
        raise StopIteration

    def _finish(self):
        msg, err = _ChatMessage(), _Error()
        _check(_gen_message(self._gen, ctypes.byref(msg), ctypes.byref(err)), err)
        try:
            n = c_int()
            ids = _gen_tokens(self._gen, ctypes.byref(n))
            self.reply = Reply(_string(msg.content), _string(msg.thinking), json.loads(_string(msg.tool_calls)),
                               [ids[i] for i in range(n.value)], _FINISH[_gen_finish(self._gen)])
        finally:
            _message_free(ctypes.byref(msg))
        self.close()

    def cancel(self):
        """Ends the generation before its next model step (safe from another thread)."""
        if self._gen:
            _gen_cancel(self._gen)

    def close(self):
        """Frees the generation (the text so far stays in the context's cache)."""
        if self._gen:
            _gen_free(self._gen)
            self._gen = None

    def __del__(self):
        if _gen_free:  # not during interpreter shutdown
            self.close()


class Model:
    """A model folder (config.json, weights, tokenizer.json, chat template, generation_config.json)
    with one context of n_ctx positions (0: the library's default). One generation runs at a time:
    starting another closes the one before. draft: a gemma4_assistant folder for speculative decoding
    (draft_n drafts per round, 0: its default); the output is the same as without. bf16_activations: the
    faster, less exact products with BF16 weights (g4_load_params.bf16_activations in gemma4c.h). mmproj:
    with a GGUF model file, llama.cpp's projector file with its vision/audio towers (g4_load_params.mmproj;
    None: the one mmproj*.gguf beside the model, if any)."""

    def __init__(self, path, *, threads=0, device=None, n_ctx=0, progress=None, draft=None, draft_n=0,
                 bf16_activations=False, mmproj=None):
        err, handle = _Error(), c_void_p()
        callback = PROGRESS_FN(lambda f, what, user: progress(f, what.decode())) if progress else PROGRESS_FN()
        lp = _LoadParams(threads, device.encode() if device else None, callback, None,
                         bf16_activations=int(bool(bf16_activations)),
                         mmproj=os.fsencode(mmproj) if mmproj is not None else None)
        self._model = self._ctx = self._drafter = None
        self._active = None
        self._draft_n = draft_n
        _check(_model_load(os.fsencode(path), ctypes.byref(lp), ctypes.byref(handle), ctypes.byref(err)), err)
        self._model = handle
        ctx, drafter = c_void_p(), c_void_p()
        cp = _ContextParams(n_seq_max=1, n_ctx=n_ctx)
        try:
            if draft:
                _check(_drafter_load(os.fsencode(draft), self._model, ctypes.byref(drafter), ctypes.byref(err)), err)
                self._drafter = drafter
            _check(_context_new(self._model, ctypes.byref(cp), ctypes.byref(ctx), ctypes.byref(err)), err)
        except Error:
            self.close()
            raise
        self._ctx = ctx
        self._tok = _model_tokenizer(self._model)

    # ------------------------------------------------------------ properties
    @property
    def vocab_size(self):
        return _model_vocab_size(self._model)

    @property
    def hidden_size(self):
        return _model_hidden_size(self._model)

    @property
    def n_ctx(self):
        return _context_n_ctx(self._ctx)

    # ------------------------------------------------------------ text
    def _tokenizer(self):
        if not self._tok:
            raise Error("the model folder has no tokenizer.json")
        return self._tok

    def tokenize(self, text, add_bos=True):
        """Token ids of text (special tokens written in it are matched, as Hugging Face does)."""
        data, toks, err = text.encode("utf-8"), _Tokens(), _Error()
        try:
            _check(_tokenize(self._tokenizer(), data, len(data), int(add_bos), ctypes.byref(toks), ctypes.byref(err)), err)
            return toks.ids[:toks.n]
        finally:
            _free(ctypes.cast(toks.ids, c_void_p))

    def detokenize(self, ids, skip_special=False):
        """The text of ids (Hugging Face's decode)."""
        arr, n = _ids_array(ids)
        out, size, err = c_void_p(), c_size_t(), _Error()
        _check(_detokenize(self._tokenizer(), arr, n, int(skip_special), ctypes.byref(out), ctypes.byref(size),
                           ctypes.byref(err)), err)
        try:
            return ctypes.string_at(out, size.value).decode("utf-8")
        finally:
            _free(out)

    def embed(self, text_or_ids):
        """The mean of the model's final hidden states over the tokens (text gets BOS): a list of
        hidden_size floats. Uses the context's sequence (a chat's cached prefix is dropped)."""
        ids = self.tokenize(text_or_ids) if isinstance(text_or_ids, str) else list(text_or_ids)
        self._close_active()
        arr, n = _ids_array(ids)
        out, err = (c_float * self.hidden_size)(), _Error()
        _check(_embed(self._ctx, 0, arr, n, out, ctypes.byref(err)), err)
        return list(out)

    # ------------------------------------------------------------ generation
    def _params(self, max_tokens, stop, ignore_eos, sampling):
        schema, gbnf = sampling.pop("json_schema", None), sampling.pop("grammar", None)
        if schema is not None and gbnf is not None:
            raise TypeError("json_schema and grammar: give one")
        sp = _SamplerParams()
        _model_sampler_params(self._model, ctypes.byref(sp))
        keep = [sp]
        bias = sampling.pop("logit_bias", None)
        seed = sampling.pop("seed", None)
        sp.seed = int.from_bytes(os.urandom(8), "little") if seed is None else seed
        for key, value in sampling.items():
            if key not in dict(_SamplerParams._fields_) or key.startswith(("bias", "suppress", "n_")):
                raise TypeError("unknown sampling option %r" % key)
            setattr(sp, key, value)
        if bias:
            ids, values = (c_int32 * len(bias))(*bias.keys()), (c_float * len(bias))(*bias.values())
            sp.bias_ids, sp.bias_values, sp.n_bias = ids, values, len(bias)
            keep += [ids, values]
        gp = _GenerationParams(max_new_tokens=max_tokens or 0, sampling=ctypes.pointer(sp), ignore_eos=int(ignore_eos),
                               drafter=self._drafter, n_draft=self._draft_n)
        if stop:
            stops = (c_char_p * len(stop))(*[s.encode("utf-8") for s in stop])
            gp.stop_strings, gp.n_stop_strings = stops, len(stop)
            keep.append(stops)
        if schema is not None or gbnf is not None:  # g4_grammar_json_schema / g4_grammar_gbnf
            grammar = _Grammar(schema, gbnf)
            gp.grammar = grammar.ptr
            keep.append(grammar)
        keep.append(gp)
        return gp, keep

    def _close_active(self):
        active = self._active and self._active()
        if active:
            active.close()

    def _run(self, start, stream, keep):
        self._close_active()
        handle, err = c_void_p(), _Error()
        _check(start(ctypes.byref(handle), ctypes.byref(err)), err)
        s = Stream(self, handle, keep)
        self._active = weakref.ref(s)
        if stream:
            return s
        for _ in s:
            pass
        return s.reply

    def generate(self, prompt, *, max_tokens=None, stream=False, stop=None, ignore_eos=False, **sampling):
        """Continues prompt (text, which gets BOS, or token ids). Returns the generated text, or
        with stream=True a Stream of text pieces (its .reply has the ids and the finish reason).
        json_schema=SCHEMA (a dict) makes the output a JSON document of that schema, grammar=TEXT a sentence of
        that GBNF grammar (llama.cpp's notation)."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        arr, n = _ids_array(ids)
        gp, keep = self._params(max_tokens, stop, ignore_eos, sampling)
        start = lambda out, err: _gen_start(self._ctx, 0, arr, n, ctypes.byref(gp), out, err)
        result = self._run(start, stream, keep + [arr])
        return result if stream else result.content

    def chat(self, messages, *, stream=False, tools=None, enable_thinking=None, max_tokens=None, stop=None,
             ignore_eos=False, **sampling):
        """The assistant's reply to messages ([{"role", "content"}, ...]) through the model's chat
        template: a Reply (content, thinking, tool_calls), or with stream=True a Stream of the
        answer's text pieces whose .reply is set at the end. The part of the conversation the
        context already holds is not processed again."""
        request = {"messages": messages}
        if tools is not None:
            request["tools"] = tools
        if enable_thinking is not None:
            request["enable_thinking"] = bool(enable_thinking)
        chat, err = c_void_p(), _Error()
        _check(_chat_new(_model_chat_template(self._model), json.dumps(request).encode("utf-8"), ctypes.byref(chat),
                         ctypes.byref(err)), err)
        try:
            gp, keep = self._params(max_tokens, stop, ignore_eos, sampling)
            start = lambda out, e: _chat_start(chat, self._ctx, 0, ctypes.byref(gp), out, e)
            return self._run(start, stream, keep)
        finally:
            _chat_free(chat)  # the generation does not need the conversation once started

    # ------------------------------------------------------------ lifetime
    def close(self):
        """Frees the model now (also done when it is garbage-collected)."""
        self._close_active()
        if self._ctx:
            _context_free(self._ctx)
            self._ctx = None
        if self._drafter:
            _drafter_free(self._drafter)
            self._drafter = None
        if self._model:
            _model_free(self._model)
            self._model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if _model_free:  # not during interpreter shutdown
            self.close()
