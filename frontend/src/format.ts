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

/** Bytes in the largest unit that keeps the number readable ("512 B", "3.4 MB", "1.2 GB"). */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes == null || !Number.isFinite(bytes) || bytes < 0) return '—'
  if (bytes < 1000) return `${bytes} B`
  const units = ['kB', 'MB', 'GB', 'TB']
  let value = bytes / 1000
  let unit = 0
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000
    unit += 1
  }
  return `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`
}

/** Seconds as "45 s", "3 min 05 s", "2 h 07 min"; an em dash when unknown. */
export function formatDuration(seconds: number | null | undefined): string {
  if (seconds == null || !Number.isFinite(seconds) || seconds < 0) return '—'
  const s = Math.round(seconds)
  if (s < 60) return `${s} s`
  const minutes = Math.floor(s / 60)
  if (minutes < 60) return `${minutes} min ${String(s % 60).padStart(2, '0')} s`
  const hours = Math.floor(minutes / 60)
  return `${hours} h ${String(minutes % 60).padStart(2, '0')} min`
}

/** A rate or count with thousands separators and at most one decimal below 100. */
export function formatRate(value: number | null | undefined): string {
  if (value == null || !Number.isFinite(value)) return '—'
  if (Math.abs(value) >= 100) return Math.round(value).toLocaleString('en-US')
  return value.toFixed(1)
}

/** Parameter counts as "135M" or "7.6B". */
export function formatParameters(count: number | null | undefined): string {
  if (count == null || !Number.isFinite(count)) return '—'
  if (count >= 1e9) return `${(count / 1e9).toFixed(count >= 1e10 ? 0 : 1)}B`
  return `${Math.round(count / 1e6)}M`
}

/** A loss or other small float with 4 significant digits; tiny values in exponent form. */
export function formatFloat(value: number | null | undefined): string {
  if (value == null || !Number.isFinite(value)) return '—'
  if (value !== 0 && Math.abs(value) < 1e-3) return value.toExponential(1)
  return Number(value.toPrecision(4)).toString()
}

/** An ISO time as local "2026-11-29 16:05". */
export function formatTime(iso: string | null | undefined): string {
  if (!iso) return '—'
  const ms = Date.parse(iso.endsWith('Z') || /[+-]\d\d:\d\d$/.test(iso) ? iso : `${iso}Z`)
  if (Number.isNaN(ms)) return iso
  const d = new Date(ms)
  const pad = (n: number) => String(n).padStart(2, '0')
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`
}

/** Epoch ms of an API time; the API may send naive UTC (SQLite) or with an offset. */
export function parseApiTime(iso: string | null | undefined): number | null {
  if (!iso) return null
  const ms = Date.parse(iso.endsWith('Z') || /[+-]\d\d:\d\d$/.test(iso) ? iso : `${iso}Z`)
  return Number.isNaN(ms) ? null : ms
}

/** Seconds as m:ss on the time axis. */
export function clock(seconds: number): string {
  const s = Math.max(0, Math.round(seconds))
  const m = Math.floor(s / 60)
  return m >= 60 ? `${Math.floor(m / 60)}:${String(m % 60).padStart(2, '0')}:${String(s % 60).padStart(2, '0')}` : `${m}:${String(s % 60).padStart(2, '0')}`
}

/**
 * What the job page says of a job queued again after its worker was lost (its `requeues`), with
 * the checkpoint it resumes from; null when that never happened.
 */
export function requeueSummary(job: { requeues: number; resume_from: string | null }): string | null {
  if (job.requeues < 1) return null
  const times = job.requeues === 1 ? 'once' : `${job.requeues} times`
  return `Its worker was lost: queued again ${times}, to resume from ${job.resume_from ?? 'the start (no checkpoint yet)'}.`
}
