# loadtest/lib.sh: helpers shared by the benchmark scripts (sourced, not
# run): run.sh, ab.sh, soak.sh, million.sh, group-commit.sh,
# bytes-per-buyer.sh.
#
# Every helper expects TMP (a scratch dir, removed by cleanup). start_server
# also expects RUN (a random tag), ADMIN_TOKEN, TICKET_SECRET and SERVER_BIN
# (the waitroom binary it runs; a caller may switch it between servers).
# Sets REDIS_PID, REDIS_PORT, REDIS_URL (start_redis) and SERVER_PID,
# SERVER_ADDR, ADMIN_ADDR, PREFIX (start_server). A script that runs more
# processes of its own adds their pids to EXTRA_PIDS: cleanup stops them
# too. `trap cleanup EXIT` is the caller's.

REDIS_PID=""
SERVER_PID=""
EXTRA_PIDS=()
# redis-server's client cap in start_redis (Redis' own default is 10000).
REDIS_MAXCLIENTS=${REDIS_MAXCLIENTS:-1000}

log() { printf '[%s %s] %s\n' "$(basename "$0")" "$(date +%T)" "$*" >&2; }

stop_pid() {
  local pid=$1
  [[ -n "$pid" ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
  local pid
  for pid in "${EXTRA_PIDS[@]}"; do stop_pid "$pid"; done
  stop_pid "$SERVER_PID"
  stop_pid "$REDIS_PID"
  rm -rf "$TMP"
}

free_port() {
  local p
  # Below the ephemeral range (32768-60999), so no client port takes it.
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# wait_ready ADDR: until a server on ADDR answers /readyz (10 s at most;
# fails after that).
wait_ready() {
  local addr=$1
  for _ in $(seq 1 100); do
    curl -fsS "http://$addr/readyz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  curl -fsS "http://$addr/readyz" >/dev/null
}

# redis_cpu: the CPU seconds (user + sys) the redis-server on
# $REDIS_PORT has used so far.
redis_cpu() { redis-cli -p "$REDIS_PORT" info cpu | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { print s }'; }

# A redis-server of our own on a free port (no persistence; the shared one
# on 6379 is never touched).
start_redis() {
  REDIS_PORT=$(free_port)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$TMP" --logfile "$TMP/redis.log" --maxclients "$REDIS_MAXCLIENTS" &
  REDIS_PID=$!
  for _ in $(seq 1 50); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -p "$REDIS_PORT" ping >/dev/null
  REDIS_URL=redis://127.0.0.1:$REDIS_PORT
  log "redis-server pid $REDIS_PID on port $REDIS_PORT"
}

# The crowd comes from a handful of loopback addresses (thousands of buyers
# each), so the per-address limits are off: they are not what is measured.
ADDRESS_LIMIT_FLAGS=(--joins-per-address-per-minute 0 --places-per-address 0
  --visitors-per-address-per-minute 0 --streams-per-address 0
  --connections-per-address 0)

# start_server NAME [extra flags…]: a fresh $SERVER_BIN with its own prefix
# and orders DB; sets SERVER_PID, SERVER_ADDR, ADMIN_ADDR (its operator
# listener: metrics and the admin API), PREFIX.
start_server() {
  local name=$1
  shift
  stop_pid "$SERVER_PID"
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
  local port
  port=$(free_port)
  SERVER_ADDR=127.0.0.1:$port
  ADMIN_ADDR=127.0.0.1:$(free_port)
  PREFIX=wr-$name-$RUN
  "$SERVER_BIN" --addr "$SERVER_ADDR" --admin-addr "$ADMIN_ADDR" --redis-url "$REDIS_URL" --key-prefix "$PREFIX" \
    --orders-db "$TMP/$name-orders.db" --admin-token "$ADMIN_TOKEN" \
    --ticket-secret "$TICKET_SECRET" --drain-secs 1 --identity header \
    "${ADDRESS_LIMIT_FLAGS[@]}" "$@" >"$TMP/$name-server.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$SERVER_ADDR"
  log "waitroom '$name' pid $SERVER_PID on $SERVER_ADDR, operators on $ADMIN_ADDR ($*)"
}
