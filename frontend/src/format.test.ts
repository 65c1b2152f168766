import { describe, expect, it } from 'vitest'
import { formatAge, formatGiB, requeueSummary } from './format'

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

import { clock, formatBytes, formatDuration, formatFloat, formatParameters, formatRate, parseApiTime } from './format'
import { validateAccount } from './pages/SetupPage'
import { safeNext } from './pages/SignInPage'
import { fieldErrors, ApiError } from './api'

describe('more formatting', () => {
  it('formats sizes, durations, rates and parameter counts', () => {
    expect(formatBytes(512)).toBe('512 B')
    expect(formatBytes(3_400_000)).toBe('3.4 MB')
    expect(formatBytes(1_250_000_000)).toBe('1.3 GB')
    expect(formatDuration(45)).toBe('45 s')
    expect(formatDuration(185)).toBe('3 min 05 s')
    expect(formatDuration(7620)).toBe('2 h 07 min')
    expect(formatDuration(null)).toBe('—')
    expect(formatRate(12345.6)).toBe('12,346')
    expect(formatRate(12.34)).toBe('12.3')
    expect(formatParameters(134_515_008)).toBe('135M')
    expect(formatParameters(7.62e9)).toBe('7.6B')
    expect(formatFloat(2.123456)).toBe('2.123')
    expect(formatFloat(0.0002)).toBe('2.0e-4')
    expect(clock(65)).toBe('1:05')
    expect(clock(3725)).toBe('1:02:05')
  })

  it('reads API times with or without a zone as UTC', () => {
    expect(parseApiTime('2026-11-29T12:00:00')).toBe(Date.parse('2026-11-29T12:00:00Z'))
    expect(parseApiTime('2026-11-29T12:00:00+00:00')).toBe(Date.parse('2026-11-29T12:00:00Z'))
    expect(parseApiTime(null)).toBeNull()
  })
})

describe('account forms', () => {
  it('checks the setup form like the server does', () => {
    expect(validateAccount({ email: 'ada@example.com', display_name: 'Ada', password: 'longenough', confirm: 'longenough' })).toEqual({})
    const errors = validateAccount({ email: 'ada', display_name: ' ', password: 'short', confirm: 'other' })
    expect(Object.keys(errors).sort()).toEqual(['confirm', 'display_name', 'email', 'password'])
  })

  it('only follows next= inside the app', () => {
    expect(safeNext('/jobs/3')).toBe('/jobs/3')
    expect(safeNext('//evil.example')).toBe('/')
    expect(safeNext('https://evil.example')).toBe('/')
    expect(safeNext(null)).toBe('/')
  })

  it('maps a 422 onto field paths', () => {
    const error = new ApiError(422, 'x', [
      { loc: ['body', 'hyperparameters', 'learning_rate'], msg: 'Input should be greater than 0' },
      { loc: ['body', 'dataset_id'], msg: 'Value error, no dataset 9' },
    ])
    expect(fieldErrors(error)).toEqual({
      'hyperparameters.learning_rate': 'Input should be greater than 0',
      dataset_id: 'no dataset 9',
    })
  })
})

describe('requeueSummary', () => {
  it('says how often the job went back to the queue after losing its worker, and from where', () => {
    expect(requeueSummary({ requeues: 0, resume_from: null })).toBeNull()
    expect(requeueSummary({ requeues: 1, resume_from: 'checkpoint-6' }))
      .toBe('Its worker was lost: queued again once, to resume from checkpoint-6.')
    expect(requeueSummary({ requeues: 2, resume_from: null }))
      .toBe('Its worker was lost: queued again 2 times, to resume from the start (no checkpoint yet).')
  })
})
