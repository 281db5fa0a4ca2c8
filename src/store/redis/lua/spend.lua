-- spend.lua: one request against a shared rate bucket (new visitors per
-- client address), for every instance together.
-- KEYS[1] the bucket (STRING, see gcra.lua), hash-tagged on its own name
-- ARGV[1] period ms   ARGV[2] burst
-- Returns 0 when allowed (counted), else the ms to wait (nothing counted).
-- Atomic because the read and the write of the bucket must be one step:
-- two instances spending the last request at once must not both get it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return gcra(KEYS[1], now, tonumber(ARGV[1]), tonumber(ARGV[2]))
