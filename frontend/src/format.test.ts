import { describe, expect, it } from 'vitest'
import { formatAge, formatGiB } from './format'

describe('formatGiB', () => {
  it('shows binary gigabytes with one decimal', () => {
    expect(formatGiB(80 * 1024 ** 3)).toBe('80.0 GiB')
    expect(formatGiB(1.5 * 1024 ** 3)).toBe('1.5 GiB')
  })

  it('shows a dash when unknown', () => {
    expect(formatGiB(null)).toBe('—')
    expect(formatGiB(undefined)).toBe('—')
  })
})

describe('formatAge', () => {
  it('rounds to the largest sensible unit', () => {
    const now = Date.parse('2026-11-29T12:00:00Z')
    expect(formatAge('2026-11-29T11:59:55Z', now)).toBe('5 s ago')
    expect(formatAge('2026-11-29T11:50:00Z', now)).toBe('10 min ago')
    expect(formatAge('not a date', now)).toBe('not a date')
  })
})
