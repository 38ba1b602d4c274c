"""Lua scripts of ``RedisPrefixIndex`` (Redis >= 7.0; no HEXPIRE needed).

Times are Redis server milliseconds (``TIME``), so all routers share one clock. Block hashes
travel as one binary blob per op (8 bytes big-endian each) and are HASH fields as such; they
are never touched arithmetically (Lua numbers are doubles). Expiry values are decimal ms
strings, compared as strings when their lengths match (always, from 2001 to 2286) and
numerically otherwise. ``unpack`` only sees slices of <= ``CHUNK`` values (Lua's C stack
allows ~8000).

The per-replica holdings keys (``{ns}:r:<tag>:<replica>``) are built inside the scripts from
replica names found in the declared ``{ns}:p:<tag>`` keys. They share the ``{ns}`` hash tag,
hence the declared keys' cluster slot, which Redis Cluster accepts for undeclared keys.

``LOOKUP`` (algorithm and its approximation: ``redis_index`` module docstring) answers with
one JSON string (``cjson.encode``), cheaper to parse in redis-py than a multi-bulk reply.

Tiers: a field's value is ``<expiry ms>`` when only the device holds the block (the old
format, so a single-tier fleet reads and writes exactly as before) and ``<expiry ms>|<bits>``
otherwise (``events.tier_bit``: 1 device, 2 host, 4 disk; Redis' Lua ``bit`` library). The
replicas that ever stored a slower-tier block are in ``{ns}:t:<tag>``; only those get the
second search for their leading device-held run.
"""

from __future__ import annotations

EXACT_BLOCKS = 8  # leading blocks matched exactly (holes seen); beyond: binary search

_COMMON = """
local _t = redis.call('TIME')
local now = tonumber(_t[1]) * 1000 + math.floor(tonumber(_t[2]) / 1000)
local CHUNK = 1000
local function ms(x) return string.format('%.0f', x) end
local now_s = ms(now)
-- stored expiry string s is still in the future
local function alive_exp(s)
  if #s == #now_s then return s > now_s end
  return tonumber(s) > now
end
-- value -> expiry string, tier bits (no '|': device only)
local function parse(v)
  local bar = string.find(v, '|', 1, true)
  if not bar then return v, 1 end
  return string.sub(v, 1, bar - 1), tonumber(string.sub(v, bar + 1))
end
local function encode(exp_s, bits)
  if bits == 1 then return exp_s end
  return exp_s .. '|' .. bits
end
local function split(blob)
  local hs = {}
  for i = 1, #blob / 8 do hs[i] = string.sub(blob, 8 * i - 7, 8 * i) end
  return hs
end
"""

# Replica -> score maps of a model's heartbeat and tombstone sets (one call each).
_LIVENESS_MAPS = """
local function score_map(key)
  local flat, map = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES'), {}
  for j = 1, #flat, 2 do map[flat[j]] = tonumber(flat[j + 1]) end
  return map
end
local function is_live(beats, tombs, r, live_ms, tomb_ms)
  local tomb = tombs[r]
  if tomb and tomb >= now - tomb_ms then return false end
  local beat = beats[r]
  return (not beat) or beat >= now - live_ms
end
"""

# Dead replicas of a model as a set: stale heartbeats and fresh tombstones (two range queries
# that are empty in the common case, instead of decoding every score).
_DEAD_SET = """
local function dead_set(hb, dead, live_ms, tomb_ms)
  local set = {}
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', hb, '-inf', '(' .. ms(now - live_ms))) do
    set[r] = true
  end
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', dead, ms(now - tomb_ms), '+inf')) do
    set[r] = true
  end
  return set
end
"""

# Leading match of the n hashes in ``blob`` (8 bytes each, sliced lazily) held unexpired in
# holdings HASH ``rev``; ``first`` / ``head`` are block 1 / blocks 2..EXACT, sliced once per
# model. Exact over the first EXACT blocks: HGET block 1 (a replica without it costs one
# probe), then one HMGET of the head. Beyond that, binary search with single-field HGETs over
# (EXACT, n]: ceil(log2(n - EXACT + 1)) probes, exact when the holdings are prefix-closed,
# otherwise it returns SOME held -> missing boundary (never below the exact match).
_LONGEST = """
local EXACT = __EXACT__
local nlen = #now_s
local function alive(v)  -- HGET / HMGET value: false when missing
  if not v then return false end
  if #v ~= nlen then v = parse(v) end
  if #v == nlen then return v > now_s end
  return tonumber(v) > now
end
local function on_device(v)  -- alive and held on the device
  if not alive(v) then return false end
  local _, bits = parse(v)
  return bits % 2 == 1
end
-- Blocks 1..lo pass ``ok``, block hi does not (hi may be virtual): binary search between.
local function search(rev, blob, lo, hi, ok)
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    if ok(redis.call('HGET', rev, string.sub(blob, 8 * mid - 7, 8 * mid))) then
      lo = mid
    else
      hi = mid
    end
  end
  return lo
end
-- Leading device-held blocks among the c matched ones (exact head, then binary search).
local function device_run(rev, blob, c)
  local m = math.min(c, EXACT)
  local vals = redis.call('HMGET', rev, unpack(split(string.sub(blob, 1, 8 * m))))
  for j = 1, m do
    if not on_device(vals[j]) then return j - 1 end
  end
  return search(rev, blob, m, c + 1, on_device)
end
local function longest(rev, blob, n, first, head)
  if not alive(redis.call('HGET', rev, first)) then return 0 end
  if #head > 0 then
    local vals = redis.call('HMGET', rev, unpack(head))
    for j = 1, #head do
      if not alive(vals[j]) then return j end
    end
  end
  return search(rev, blob, 1 + #head, n + 1, alive)  -- n + 1: a virtual missing block
end
"""

# KEYS: per model: hb, dead, reps, tiered.   ARGV: live_ms, tomb_ms, then per model:
# holdings-key prefix, hash blob. Returns JSON: a list with, per model, {replica: matched}, or
# {replica: [matched, not on device]} (one bulk string: redis-py parses it far faster than a
# multi-bulk reply).
LOOKUP = (
    _COMMON
    + _DEAD_SET
    + _LONGEST.replace("__EXACT__", str(EXACT_BLOCKS))
    + """
local live_ms, tomb_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for m = 1, #KEYS / 4 do
  local rprefix, blob = ARGV[1 + 2 * m], ARGV[2 + 2 * m]
  local found, n = {}, math.floor(#blob / 8)
  if n > 0 then
    local holders = redis.call('ZRANGEBYSCORE', KEYS[4 * m - 1], '(' .. now_s, '+inf')
    if #holders > 0 then
      local dead = dead_set(KEYS[4 * m - 3], KEYS[4 * m - 2], live_ms, tomb_ms)
      local tiered = {}
      for _, r in ipairs(redis.call('SMEMBERS', KEYS[4 * m])) do tiered[r] = true end
      local first, head = string.sub(blob, 1, 8), split(string.sub(blob, 9, 8 * EXACT))
      for _, r in ipairs(holders) do
        if not dead[r] then
          local c = longest(rprefix .. r, blob, n, first, head)
          if c > 0 and tiered[r] then
            local d = device_run(rprefix .. r, blob, c)
            if d < c then c = {c, c - d} end
          end
          if c ~= 0 then found[r] = c end
        end
      end
    end
  end
  out[m] = found
end
return cjson.encode(out)
"""
)

# Incremental sweep of expired fields: HSCAN ``budget`` entries from a cursor kept in ``curs``.
_SWEEP = """
local function sweep(rev, curs, r, budget)
  local res = redis.call('HSCAN', rev, redis.call('HGET', curs, r) or '0', 'COUNT', budget)
  local flat, stale = res[2], {}
  for j = 1, #flat, 2 do
    if not alive_exp((parse(flat[j + 1]))) then stale[#stale + 1] = flat[j] end
  end
  for s = 1, #stale, CHUNK do
    redis.call('HDEL', rev, unpack(stale, s, math.min(s + CHUNK - 1, #stale)))
  end
  if res[1] == '0' then redis.call('HDEL', curs, r) else redis.call('HSET', curs, r, res[1]) end
end
-- Writes expiry ``exp`` in tier ``tb`` for hashes hs (never lowering an expiry; an unexpired
-- entry keeps its other tiers); returns how many fields are new.
local function store(rev, hs, exp, tb)
  local exp_s, added = ms(exp), 0
  for s = 1, #hs, CHUNK do
    local last = math.min(s + CHUNK - 1, #hs)
    local cur, args = redis.call('HMGET', rev, unpack(hs, s, last)), {}
    for j = s, last do
      local v = cur[j - s + 1]
      if not v then added = added + 1 end
      local old_s, bits = exp_s, tb
      if v then
        old_s, bits = parse(v)
        if alive_exp(old_s) then bits = bit.bor(bits, tb) else bits = tb end
      end
      local keep = v and tonumber(old_s) >= exp
      if (not v) or (not keep) or encode(old_s, bits) ~= v then
        args[#args + 1] = hs[j]
        args[#args + 1] = encode(keep and old_s or exp_s, bits)
      end
    end
    if #args > 0 then redis.call('HSET', rev, unpack(args)) end
  end
  return added
end
-- Drops tier ``tb`` of hashes hs; a field goes when no tier holds it any more.
local function drop(rev, hs, tb)
  for s = 1, #hs, CHUNK do
    local last = math.min(s + CHUNK - 1, #hs)
    local cur, gone, args = redis.call('HMGET', rev, unpack(hs, s, last)), {}, {}
    for j = s, last do
      local v = cur[j - s + 1]
      if v then
        local e, bits = parse(v)
        local left = bit.band(bits, bit.bnot(tb))
        if left == 0 then
          gone[#gone + 1] = hs[j]
        else
          args[#args + 1] = hs[j]
          args[#args + 1] = encode(e, left)
        end
      end
    end
    if #gone > 0 then redis.call('HDEL', rev, unpack(gone)) end
    if #args > 0 then redis.call('HSET', rev, unpack(args)) end
  end
end
"""

# KEYS[1] = models hash; per op: dead, holdings (rev), reps, cursors, tiered.
# ARGV: backstop_ms (= max ttl = tombstone ttl), then per op:
#   kind ('S' store/route | 'D' remove | 'C' clear), tag, model, replica, ttl_ms, hash blob,
#   tier bit.
WRITE = (
    _COMMON
    + _SWEEP
    + """
local backstop = tonumber(ARGV[1])
for op = 1, (#KEYS - 1) / 5 do
  local k = 5 * op - 3
  local dead, rev, reps, curs, tiered = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local a = 7 * op - 5
  local kind, tag, model, r = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local ttl, hs, tb = tonumber(ARGV[a + 4]), split(ARGV[a + 5]), tonumber(ARGV[a + 6])
  local tomb = redis.call('ZSCORE', dead, r)
  if tomb and tonumber(tomb) >= now - backstop then
    -- removed replica: drop late writes so they cannot resurrect it
  elseif kind == 'S' and #hs > 0 then
    local exp = now + ttl
    -- sweep twice as many fields as were added: garbage stays <= live entries
    sweep(rev, curs, r, 2 * store(rev, hs, exp, tb) + 64)
    if tb ~= 1 then
      redis.call('SADD', tiered, r)
      redis.call('PEXPIRE', tiered, backstop)
    end
    redis.call('PEXPIRE', rev, backstop)
    redis.call('ZADD', reps, 'GT', exp, r)
    redis.call('ZREMRANGEBYSCORE', reps, '-inf', now)
    for _, k in ipairs({reps, curs}) do redis.call('PEXPIRE', k, backstop) end
    redis.call('HSET', KEYS[1], tag, model)
  elseif kind == 'D' and #hs > 0 then
    if tb == 1 and redis.call('SISMEMBER', tiered, r) == 0 then  -- device only: plain delete
      for s = 1, #hs, CHUNK do
        redis.call('HDEL', rev, unpack(hs, s, math.min(s + CHUNK - 1, #hs)))
      end
    else
      drop(rev, hs, tb)
    end
    if redis.call('EXISTS', rev) == 0 then
      redis.call('ZREM', reps, r)
      redis.call('HDEL', curs, r)
    end
  elseif kind == 'C' then
    redis.call('UNLINK', rev)
    redis.call('ZREM', reps, r)
    redis.call('HDEL', curs, r)
    redis.call('SREM', tiered, r)
  end
end
return 1
"""
)

# KEYS: models, hb, dead, reps, cursors, holdings, tiered
# ARGV: op ('beat' | 'kill'), tag, model, r
LIVENESS = (
    _COMMON
    + """
local op, tag, model, r = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if op == 'beat' then
  redis.call('ZADD', KEYS[2], now, r)
  redis.call('ZREM', KEYS[3], r)
  redis.call('HSET', KEYS[1], tag, model)
else
  redis.call('ZREM', KEYS[2], r)
  redis.call('ZADD', KEYS[3], now, r)
  redis.call('ZREM', KEYS[4], r)
  redis.call('HDEL', KEYS[5], r)
  redis.call('UNLINK', KEYS[6])  -- freed in the background, O(1) here
  redis.call('SREM', KEYS[7], r)
end
return 1
"""
)

# KEYS: per model hb, dead, reps, cursors, tiered
# ARGV: live_ms, tomb_ms, per model holdings prefix.
# Tombstones and purges replicas whose heartbeat expired; returns how many.
PURGE_DEAD = (
    _COMMON
    + """
local live_ms, tomb_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local count = 0
for m = 1, #KEYS / 5 do
  local hb, dead, reps, curs = KEYS[5 * m - 4], KEYS[5 * m - 3], KEYS[5 * m - 2], KEYS[5 * m - 1]
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', hb, '-inf', '(' .. ms(now - live_ms))) do
    redis.call('SREM', KEYS[5 * m], r)
    redis.call('ZREM', hb, r)
    redis.call('ZADD', dead, now, r)
    redis.call('ZREM', reps, r)
    redis.call('HDEL', curs, r)
    redis.call('UNLINK', ARGV[2 + m] .. r)
    count = count + 1
  end
  redis.call('ZREMRANGEBYSCORE', dead, '-inf', '(' .. ms(now - tomb_ms))
end
return count
"""
)

# KEYS: hb, dead, reps   ARGV: live_ms, tomb_ms, holdings-key prefix
# Returns live replicas, then '' and the number of entries (not yet swept) of all holders.
LIVE_AND_COUNT = (
    _COMMON
    + _LIVENESS_MAPS
    + """
local live_ms, tomb_ms, rprefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local beats, tombs = score_map(KEYS[1]), score_map(KEYS[2])
local seen, out, entries = {}, {}, 0
local holders = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now_s, '+inf')
for _, list in ipairs({redis.call('ZRANGEBYSCORE', KEYS[1], now - live_ms, '+inf'), holders}) do
  for _, r in ipairs(list) do
    if not seen[r] then
      seen[r] = true
      if is_live(beats, tombs, r, live_ms, tomb_ms) then out[#out + 1] = r end
    end
  end
end
for _, r in ipairs(holders) do entries = entries + redis.call('HLEN', rprefix .. r) end
out[#out + 1] = ''
out[#out + 1] = entries
return out
"""
)
