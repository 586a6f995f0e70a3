// kiro's plugin for opencode, loaded by kiro's opencode preset (OPENCODE_CONFIG_CONTENT's `plugin`).
// opencode retries a failed model call itself, after the server's retry-after however long it is (hours,
// for a used-up usage window), and says so only on its event bus: `session.status` with status
// {type: "retry", attempt, message, next} (`next`: when it tries again, ms since 1970). `opencode run
// --format json` prints none of it, so the run sits silent. This prints that event to stdout as one more
// JSON line, as it happens, for kiro to read.
export const KiroRetryNotice = async () => ({
  event: async ({ event }) => {
    if (event.type !== "session.status" || event.properties?.status?.type !== "retry") return
    process.stdout.write(JSON.stringify({ type: "session.status", timestamp: Date.now(), ...event.properties }) + "\n")
  },
})
