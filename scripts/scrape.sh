# Sourced by the bench scripts: scrape HOST:PORT/PATH [CURL ARGS] prints a tier's
# /metrics (or pprof) endpoint. Under mutual TLS (TLS unset or 1) the
# tiers serve it over HTTPS with their certificates: curl verifies the
# tier against the CA and presents the admin certificate (needed only
# where the tiers run with --metrics-client-cert), from $certs in either
# layout (certs init's DIR/admin/, or the old flat DIR/admin.pem). With
# TLS=0 (the stacks run --insecure) it is plain HTTP.
scrape() {
	local target=$1
	shift
	if [ "${TLS:-1}" = 0 ]; then
		curl -s "$@" "http://$target"
		return
	fi
	local tlsargs
	if [ -d "$certs/admin" ]; then
		tlsargs=(--cacert "$certs/admin/ca.pem" --cert "$certs/admin/cert.pem" --key "$certs/admin/key.pem")
	else
		tlsargs=(--cacert "$certs/ca.pem" --cert "$certs/admin.pem" --key "$certs/admin-key.pem")
	fi
	curl -s "${tlsargs[@]}" "$@" "https://$target"
}
