-- A host's agent says an instance whose claim was taken from it (hold_claim in lib.lua)
-- no longer runs there: the claim held for it is released. Idempotent.
-- KEYS[1]  the host's held claims key
-- ARGV     prefix, host, instance
return reply({released = drop_held(ARGV[2], ARGV[3])})
