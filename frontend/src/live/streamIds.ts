/**
 * Redis Stream ids ("1700000000000-3"): milliseconds, then a sequence number. They order the
 * events of a stream, and the milliseconds are when the event was written.
 */
export function parseStreamId(id: string): [number, number] | null {
  const match = /^(\d+)(?:-(\d+))?$/.exec(id)
  if (!match) return null
  return [Number(match[1]), Number(match[2] ?? 0)]
}

/** Negative when a comes first, 0 when equal, positive when b comes first. Unparsable ids sort first. */
export function compareStreamIds(a: string, b: string): number {
  const pa = parseStreamId(a)
  const pb = parseStreamId(b)
  if (!pa || !pb) return (pa ? 1 : 0) - (pb ? 1 : 0)
  return pa[0] - pb[0] || pa[1] - pb[1]
}

/** Epoch milliseconds at which the event was written; null when the id does not parse. */
export function streamIdTime(id: string): number | null {
  return parseStreamId(id)?.[0] ?? null
}
