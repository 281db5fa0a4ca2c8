-- fair_nodes.lua: reads stored Merkle tree nodes of a queue's public
-- admission log.
-- KEYS[1..] node LISTs (see fair_append.lua), one per node asked for
-- ARGV[i] the index of the node in KEYS[i]
-- Returns the hashes in order, false for a node not stored.
-- Why a script: one round trip for a proof's O(log^2 n) nodes, in a
-- cluster as on one server (every key is under the queue's hash tag).
-- Cost: one LINDEX per node (O(index / 128) in a quicklist: a node list
-- of a million-leaf log has at most a million elements).
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('LINDEX', KEYS[i], ARGV[i])
end
return out
