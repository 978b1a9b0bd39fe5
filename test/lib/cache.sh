# Sourced by the scripts that make something once into ~/.cache/outbox (test/kafka/fetch-jars.sh,
# test/cloudevents-java/build.sh, test/librdkafka/build.sh). A cached directory DIR is complete
# while DIR/.complete holds WANT, what it was made from; its maker writes the stamp last, after
# renaming a finished staging directory into place, so a run cut short leaves nothing complete.

# cache_complete DIR WANT: whether DIR is complete for WANT.
cache_complete() { [[ -f $1/.complete && $(cat "$1/.complete") == "$2" ]]; }

# cached_or_lock DIR WANT LOCK: when DIR is complete, prints it and ends the calling script.
# Else waits for LOCK (flock on fd 9, held until the script ends: concurrent first runs make DIR
# once) and ends the same way if the run it waited for completed DIR; returns when the caller
# must make DIR.
cached_or_lock() {
	local dir=$1 want=$2 lock=$3
	if cache_complete "$dir" "$want"; then
		echo "$dir"
		exit 0
	fi
	exec 9>"$lock"
	if ! flock -w 1800 9; then
		echo "$(basename "$0"): error: timed out waiting for the lock $lock" >&2
		exit 1
	fi
	if cache_complete "$dir" "$want"; then
		echo "$dir"
		exit 0
	fi
}
