-- put_settings.lua: writes one queue's settings.
-- KEYS[1] the queue's settings HASH (batch, intervalMs, tokenTtlMs,
--         maxActive (-1 = unlimited), abandonAfterMs (0 = never),
--         claimLeaseMs, texts (JSON object), adaptive (JSON object, '' off),
--         shopUrl ('' none),
--         version, updatedAt)
-- ARGV[1] '1': write only if the queue has no settings yet, else '0'
-- ARGV[2..] field, value pairs to write
-- Returns 1 if written, 0 if not (ARGV[1] and the hash existed).
-- Atomic so every write gets its own version, stamped with the store
-- clock, and a reader (an admission pass, an instance's reload) never
-- sees half of one write and half of another.
-- Not prefixed with common.lua: it touches no other key of the queue.
if ARGV[1] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fields = {}
for i = 2, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], 'updatedAt', now, unpack(fields))
redis.call('HINCRBY', KEYS[1], 'version', 1)
return 1
