# Sourced by the bench scripts: SERVER_CPUS and CLIENT_CPUS (taskset
# lists, e.g. 0 and 1) pin the serving processes ("${srv[@]}" before
# their command) and the load generator ("${cli[@]}") to cores of their
# own, so the client's work (its TLS, the requests it has refused) does
# not take the servers' cores: on one host, the closest to a load
# generator on another machine. Unset: no pinning.
srv=()
cli=()
if [ -n "${SERVER_CPUS:-}" ]; then srv=(taskset -c "$SERVER_CPUS"); fi
if [ -n "${CLIENT_CPUS:-}" ]; then cli=(taskset -c "$CLIENT_CPUS"); fi
