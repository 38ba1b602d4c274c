"""Incremental tokenization: token ids of rendered-prompt prefixes, cached per router replica.

An agent's turn N+1 repeats turn N's rendered prompt and adds a little. Each router replica
keeps a bounded (bytes, LRU) trie of the token ids of rendered-text *segments*; a request
walks the trie along its own text, takes the ids of the longest cached prefix and
tokenizes only the rest. The result is bit-identical to tokenizing the whole text.

Boundaries: a prompt is cut right after each occurrence of a *boundary token*, an added
token of the tokenizer that the chat template emits between messages (``<|im_end|>`` and
``<|im_start|>`` for ChatML templates, ``<|eot_id|>`` / ``<|start_header_id|>`` /
``<|end_header_id|>`` for Llama 3). Why ``encode(A + B) == encode(A) + encode(B)`` when
``A`` ends with a boundary token ``T`` (``tokenizers``' pipeline, add_special_tokens off):

1. Added tokens are extracted first, on the raw text (leftmost-longest match), and only
   the pieces *between* them are normalized, pre-tokenized (the regex split) and run
   through the model, each piece on its own. So if ``T``'s occurrence is matched as an
   added token and no added-token match spans the cut, the pieces left of the cut are
   exactly ``A``'s and the pieces right of it exactly ``B``'s.
2. No match spans the cut, and ``T``'s occurrence is always matched, if for every other
   added token ``S``: ``T`` is not inside ``S``, no proper prefix of ``T`` ends ``S``, and
   no proper suffix of ``T`` starts ``S``; and ``T`` has no border (no proper prefix that
   is also its suffix, so occurrences of ``T`` never overlap).
3. The match of ``T`` itself must not depend on what follows: ``rstrip`` and
   ``single_word`` off, ``normalized`` off (matched on the raw text). Its last character is
   neither a space nor a word character, so an ``lstrip`` or ``single_word`` token at the
   start of ``B`` behaves the same after ``T`` as at the start of a string.
4. Every stage after the split must treat each piece alone: the normalizers, pre-tokenizers
   and models listed in ``_PIECE_LOCAL`` do; Metaspace with ``prepend_scheme: first`` does
   not (it adds "▁" only to the piece at offset 0 of the whole string, so ``B`` alone
   would get it), nor do truncation, padding, BPE dropout or ``encode_special_tokens``.

Chat prompts whose client strings hold special-token strings arrive *marked*
(``router.prompt.specials``): the client's occurrences are private-use markers, so only
the template's tokens are boundaries (a client's ``<|im_end|>`` is never a cut), and their
pieces are encoded by ``ClientSpecials.encode_pieces``, which splits at added tokens as
rule 1 says; the identity holds for it as for the tokenizer.

A tokenizer passes (2)-(4) statically (``router.prompt.boundaries``), then a probe encodes
tricky continuations both ways (spaces, newlines, combining marks, digits, the token
itself); a token that fails any check
is not a boundary, and a tokenizer with no boundary is tokenized whole every time.
``tests/router/prompt/test_prompt_cache.py`` checks the identity on thousands of conversations.

Lookup: children are keyed by the segment's exact text (a dict: hash, then equality), so
a template that rewrites an earlier turn (e.g. drops past reasoning) falls back at the
first segment that differs. Whole new segments are encoded in one batch
(``router.prompt.pieces``), which the ``tokenizers`` library runs in parallel with the
GIL released.

Scopes (``Scope``): one trie per way a text was encoded (a chat render or a raw completions
prompt; client special-token strings marked or not) and, under ``index.tenant_isolation``,
per tenant, so one text encoded two ways never shares ids, and a tenant never reads
another's (which a right guess's faster tokenization would show).

Second level (``router.prompt.store``, when ``index.redis_url`` is set): a long prompt whose
uncached part is at least ``min_lookup_chars`` (16k) asks Redis for the segments that follow its
local prefix (one MGET by chained segment digests), keeps those whose text matches, and
a prompt of at least that size queues what Redis lacks (its new segments, and earlier ones
not yet written) for a background write once its request is admitted (``publish``).
"""

from __future__ import annotations

import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tokenizers import Tokenizer

from cache_service.hashing import U32Ids, token_bytes
from deploy.config import PromptCacheConfig
from router.prompt import store as ts
from router.prompt.boundaries import boundary_tokens
from router.prompt.pieces import encode_pieces

__all__ = ["IncrementalEncoder", "PromptCacheConfig", "Scope", "TokenIds", "boundary_tokens"]

PiecesEncoder = Callable[[list[str]], list[list[int]]]
# Per cached token: a list slot (ints are interned) and 4 bytes of ``u32``; per segment: the
# node and its dict slot.
_ID_BYTES, _NODE_BYTES = 12, 400


class TokenIds(U32Ids):
    """A prompt's token ids and their u32 bytes (``U32Ids``: the hashes and the loopback
    wire slice them), plus the memo of the chained block hashes of its cached prefix
    (``cache_service.hashing.block_hashes`` reads it) and the segments the second level
    lacks, written only once the request is admitted (``IncrementalEncoder.publish``)."""

    __slots__ = ("hash_memo", "pending")


@dataclass(frozen=True, slots=True)
class Scope:
    """How a text was encoded, and for whom: the cache keeps one trie per scope (and the
    token store one digest chain), so ids written one way are never read another way, nor
    by another tenant. ``source``: "raw", a completions prompt (every added-token string in
    it extracted), or "chat", the chat template's render; ``marked``: client special-token
    strings in it are marked (``router.prompt.specials``); ``tenant``: the key under
    ``index.tenant_isolation`` (None: shared)."""

    source: str = "raw"
    marked: bool = False
    tenant: str | None = None

    def seed(self) -> tuple[str, ...]:
        return (self.source, "marked" if self.marked else "plain",
                "" if self.tenant is None else f"tenant:{self.tenant}")


# -- the cache ----------------------------------------------------------------------------
# Ids per step of the pool thread's work on a prompt's ids. One C call over a cold 155k-id
# prompt holds the GIL 3-8 ms, and the event loop waits for it: every stream on the router
# stalls (found with a loop-lag probe). Between steps the interpreter can hand the GIL over.
_STEP = 8192


def _u32(ids: list[int]) -> bytes:
    """``ids`` as u32 bytes (``hashing.token_bytes``), ``_STEP`` ids at a time."""
    return b"".join([token_bytes(ids, i + _STEP, i) for i in range(0, len(ids), _STEP)])


@dataclass(eq=False, slots=True)
class _Node:
    parent: _Node | None
    text: str
    ids: list[int]
    u32: bytes  # ``ids`` as u32 bytes: a prompt's ``TokenIds.u32`` joins its nodes'
    end: int  # tokens from the prompt's start to this segment's end
    size: int = 0
    alive: bool = True
    digest: bytes = b""  # the chained digest of the text up to here (second level only)
    stored: int = 0  # in Redis? 0: no, 1: queued, 2: written
    children: dict[str, _Node] = field(default_factory=dict)
    hashes: dict[tuple[int, int], list[int]] = field(default_factory=dict)


@dataclass(slots=True)
class _Pending:
    """What a prompt's request writes to the second level once admitted: the segments it
    lacks, and the entries it read (their digests and bytes), whose TTL it renews."""

    nodes: list[_Node]
    touched: tuple[list[bytes], int]


class _Memo:
    """The chained block hashes of a cached path, one slice per node (a prefix property:
    the hashes of a prefix's full blocks are the first hashes of the whole prompt)."""

    __slots__ = ("nodes",)

    def __init__(self, nodes: list[_Node]) -> None:
        self.nodes = nodes

    def known(self, block_size: int, salt: int) -> list[int]:
        out: list[int] = []
        for node in self.nodes:
            part = node.hashes.get((block_size, salt))
            if part is None:
                break
            out.extend(part)
        return out

    def learn(self, block_size: int, salt: int, hashes: Sequence[int]) -> None:
        key = (block_size, salt)
        for node in self.nodes:
            last = node.end // block_size
            if last > len(hashes):
                break
            if key not in node.hashes:
                node.hashes[key] = list(hashes[(node.end - len(node.ids)) // block_size:last])


class IncrementalEncoder:
    """``encode(text)``: the ids of ``tok.encode(text, add_special_tokens=False)``, reusing
    the cached ids of the longest prefix of ``text`` that ends at a boundary. Thread-safe;
    the lock is held only to walk and update the trie, never while tokenizing."""

    def __init__(self, tok: Tokenizer, boundaries: Sequence[str], max_bytes: int,
                 store: ts.TokenStore | None = None, fingerprint: str = "") -> None:
        self._tok = tok
        self.boundaries = tuple(boundaries)
        self.max_bytes = max_bytes
        self._cut = (re.compile("|".join(map(re.escape, sorted(boundaries, key=len)[::-1])))
                     if boundaries and max_bytes > 0 else None)
        self._ints = list(range(tok.get_vocab_size(with_added_tokens=True)))
        self._fingerprint = fingerprint
        self._roots: dict[Scope, _Node] = {}  # scopes: 4 per tenant at most (keys: the config)
        self.store = store if self._cut is not None else None
        self.remote_tokens = 0
        self._lru: OrderedDict[_Node, None] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hit_tokens = 0
        self.new_tokens = 0

    @property
    def active(self) -> bool:
        return self._cut is not None

    def _root(self, scope: Scope) -> _Node:
        root = self._roots.get(scope)
        if root is None:
            root = self._roots[scope] = _Node(None, "", [], b"", 0, digest=ts.chain_seed(
                self._fingerprint, self.boundaries, scope.seed()))
        return root

    def encode(self, text: str, pieces_encoder: PiecesEncoder | None = None,
               scope: Scope = Scope()) -> TokenIds:  # noqa: B008 (frozen)
        """``pieces_encoder``: how a list of pieces of ``text`` is tokenized (default: the
        tokenizer's batch); it must split at added tokens as the tokenizer does (rule 1), as
        ``router.prompt.specials`` does for text with client special-token strings marked.
        ``scope``: the trie read and written. Nothing goes to the second level until
        ``publish``: a request refused after its encoding writes nothing there."""
        if self._cut is None:
            return self._whole(text, pieces_encoder)
        cuts = [m.end() for m in self._cut.finditer(text)]
        with self._lock:
            root = self._root(scope)
            path = self._walk(root, text, cuts)
        start = cuts[len(path) - 1] if path else 0
        bounds = [start, *cuts[len(path):]]
        if bounds[-1] != len(text):
            bounds.append(len(text))
        pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        n_whole = len(cuts) - len(path)  # pieces that end at a boundary: cacheable
        digests = (ts.chain((path[-1] if path else root).digest, pieces[:n_whole])
                   if self.store is not None else [])
        remote, touched = self._remote(pieces[:n_whole], digests)
        segs = self._tokenize(pieces, remote, pieces_encoder)
        wires = [_u32(ids) for ids in segs]
        with self._lock:
            nodes = self._insert(root, path, pieces[:n_whole], segs[:n_whole], wires, digests,
                                 remote)
        out = TokenIds()
        for node in path:
            out.extend(node.ids)
        hit, got = len(out), sum(len(r) for r in remote if r is not None)
        for ids in segs:
            out.extend(ids)
        self.hit_tokens += hit  # approximate under threads: statistics only
        self.remote_tokens += got
        self.new_tokens += len(out) - hit - got
        out.hash_memo = _Memo(path + nodes)
        out.u32 = b"".join([*(node.u32 for node in path), *wires])
        # shorter prompts' segments go with a longer one's
        long = self.store is not None and len(text) >= self.store.min_lookup_chars
        out.pending = _Pending(path + nodes if long else [], touched) \
            if long or touched[0] else None
        return out

    def publish(self, ids: list[int], owner: str | None = None) -> None:
        """Write to the second level what ``ids`` (an ``encode`` result) found missing
        there, and renew what it read: called once its request is admitted, never for one
        refused (a 400, 413 or 429 after the encoding), so refused requests cost the shared
        Redis nothing. ``owner``: the key whose share of the store it counts against."""
        pending = getattr(ids, "pending", None)
        if pending is None or self.store is None:
            return
        ids.pending = None  # type: ignore[attr-defined]  # a TokenIds: once
        if pending.nodes:
            self._publish(pending.nodes, owner)
        if pending.touched[0]:
            self.store.touch(*pending.touched, owner)

    def _remote(self, pieces: list[str], digests: list[bytes]
                ) -> tuple[list[list[int] | None], tuple[list[bytes], int]]:
        """The second level's ids for each of ``pieces`` (whole segments after the local
        prefix) it holds, when they are long enough to be worth a round trip; and the
        entries that gave them, with their bytes (renewed by ``publish``)."""
        if self.store is None or sum(map(len, pieces)) < self.store.min_lookup_chars:
            return [None] * len(pieces), ([], 0)
        blobs = self.store.fetch(digests)
        got, used = ts.cover(pieces, blobs)
        touched = ([digests[j] for j in used], sum(len(blobs[j] or b"") for j in used))
        return [None if ids is None else self._interned(ids) for ids in got], touched

    def _tokenize(self, pieces: list[str], remote: list[list[int] | None],
                  pieces_encoder: PiecesEncoder | None) -> list[list[int]]:
        """Each piece's ids: the remote ones as given, the others in one batch (the whole
        segments' ids interned, as the cache keeps them)."""
        segs: list[list[int]] = [r or [] for r in remote] + [[]] * (len(pieces) - len(remote))
        todo = [i for i in range(len(pieces)) if i >= len(remote) or remote[i] is None]
        if todo:
            batch = (pieces_encoder or self._batch)([pieces[i] for i in todo])
            for i, ids in zip(todo, batch, strict=True):
                segs[i] = self._interned(ids) if i < len(remote) else ids
        return segs

    def _interned(self, ids: list[int]) -> list[int]:
        """``ids`` as the vocabulary's own int objects (what the cache keeps: one object per
        id, not per occurrence), a slice at a time (``_STEP``)."""
        out: list[int] = []
        for i in range(0, len(ids), _STEP):
            out += map(self._ints.__getitem__, ids[i:i + _STEP])
        return out

    def _batch(self, pieces: list[str]) -> list[list[int]]:
        return encode_pieces(self._tok, pieces)

    def _publish(self, nodes: list[_Node], owner: str | None = None) -> None:
        """Queue the runs of ``nodes`` that Redis does not have yet (fire-and-forget)."""
        assert self.store is not None
        runs: list[list[_Node]] = []
        with self._lock:
            last = -2
            for i, node in enumerate(nodes):
                if node.stored:
                    continue
                node.stored = 1
                if i != last + 1:
                    runs.append([])
                runs[-1].append(node)
                last = i
        if runs:
            self.store.put(runs, owner)

    def _whole(self, text: str, pieces_encoder: PiecesEncoder | None = None) -> TokenIds:
        ids = (pieces_encoder or self._batch)([text])[0]
        out = TokenIds(ids)
        out.hash_memo, out.u32, out.pending = None, _u32(ids), None
        return out

    def _walk(self, root: _Node, text: str, cuts: list[int]) -> list[_Node]:
        path: list[_Node] = []
        node, prev = root, 0
        for cut in cuts:
            child = node.children.get(text[prev:cut])
            if child is None:
                break
            path.append(child)
            node, prev = child, cut
        self._touch(path)
        return path

    def _insert(self, root: _Node, path: list[_Node], pieces: list[str], ids: list[list[int]],
                wires: list[bytes], digests: list[bytes], remote: list[list[int] | None]
                ) -> list[_Node]:
        parent = path[-1] if path else root
        if not parent.alive:  # evicted while we tokenized
            return []
        added: list[_Node] = []
        for i, (text, seg) in enumerate(zip(pieces, ids, strict=True)):
            node = parent.children.get(text)
            if node is None:
                node = _Node(parent, text, seg, wires[i], parent.end + len(seg),
                             digest=digests[i] if digests else b"",
                             stored=0 if remote[i] is None else 2)
                node.size = sys.getsizeof(text) + _ID_BYTES * len(seg) + _NODE_BYTES
                if node.size > self.max_bytes:
                    break
                parent.children[text] = node
                self.bytes += node.size
            added.append(node)
            parent = node
        self._touch(path + added)
        self._evict()
        return added  # evicted or not, each node's ids and hashes stay exact

    def _touch(self, nodes: list[_Node]) -> None:
        # Leaf first, so that a parent is always more recent than its children and the
        # LRU end only ever holds leaves.
        for node in reversed(nodes):
            self._lru[node] = None
            self._lru.move_to_end(node)

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._lru:
            node, _ = self._lru.popitem(last=False)
            node.alive = False
            parent = node.parent
            if parent is not None and parent.children.get(node.text) is node:
                del parent.children[node.text]
            self.bytes -= node.size

    def stats(self) -> dict[str, int]:
        return {"bytes": self.bytes, "segments": len(self._lru), "hit_tokens": self.hit_tokens,
                "remote_tokens": self.remote_tokens, "new_tokens": self.new_tokens}
