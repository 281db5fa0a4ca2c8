-- fair_append.lua: appends leaves to a queue's public admission log, with
-- the Merkle tree nodes they complete, if the log still has the size the
-- appender read.
-- KEYS[1] the log's HASH (size, cursor, headSize, head)
-- KEYS[2] the leaves (LIST of compact JSON, one per leaf, in log order)
-- KEYS[3..] the node LISTs of levels 0, 1, ... (32-byte binary hashes;
--           element i of level L is the hash of leaves [i*2^L, (i+1)*2^L))
--           as many as the append writes to; all under the queue's hash tag
-- ARGV[1] the size read  ARGV[2] the cursor after this append (audit id)
-- ARGV[3] n, the number of leaves, then the n leaves, then for each level
--         of KEYS[3..] in order: its count c, then its c hashes
-- Returns 1 when appended, 0 when the log's size is not ARGV[1] (another
-- instance appended first: nothing changes).
-- Why atomic: the leaves, their nodes and the cursor move together, and
-- the size check and the append are one step, so two instances appending
-- the same audit entries never append them twice nor interleave them.
-- Cost: O(n) list pushes (about two nodes per leaf); called once a second
-- per queue with the audit entries of that second.
local size = tonumber(redis.call('HGET', KEYS[1], 'size') or '0')
if size ~= tonumber(ARGV[1]) then
  return 0
end
local n = tonumber(ARGV[3])
local at = 4
if n > 0 then
  redis.call('RPUSH', KEYS[2], unpack(ARGV, at, at + n - 1))
end
at = at + n
for k = 3, #KEYS do
  local c = tonumber(ARGV[at])
  if c > 0 then
    redis.call('RPUSH', KEYS[k], unpack(ARGV, at + 1, at + c))
  end
  at = at + 1 + c
end
redis.call('HSET', KEYS[1], 'size', size + n, 'cursor', ARGV[2])
return 1
