const GIB = 1024 ** 3

/** Bytes as GiB with one decimal ("79.6 GiB"); an em dash when unknown. */
export function formatGiB(bytes: number | null | undefined): string {
  if (bytes == null || !Number.isFinite(bytes) || bytes < 0) return '—'
  return `${(bytes / GIB).toFixed(1)} GiB`
}

/** A short "12 s ago" style age for an ISO time; the raw string if it does not parse. */
export function formatAge(iso: string, now: number = Date.now()): string {
  const then = Date.parse(iso)
  if (Number.isNaN(then)) return iso
  const seconds = Math.max(0, Math.round((now - then) / 1000))
  if (seconds < 60) return `${seconds} s ago`
  const minutes = Math.round(seconds / 60)
  if (minutes < 60) return `${minutes} min ago`
  const hours = Math.round(minutes / 60)
  if (hours < 48) return `${hours} h ago`
  return `${Math.round(hours / 24)} d ago`
}
