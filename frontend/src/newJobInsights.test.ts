import { describe, expect, it } from 'vitest'
import { deviceFits } from './memoryFit'
import { healthFixture } from './test/fixtures'
import { lengthHistogram } from './tokenHistogram'

const GIB = 1024 ** 3

describe('lengthHistogram', () => {
  it('counts the sequences the max length would cut, bin by bin', () => {
    const h = lengthHistogram([10, 20, 30, 90, 100, 120], 64, 4)
    expect(h.truncated).toBe(3)
    expect(h.total).toBe(6)
    expect(h.bins.map((b) => b.from)).toEqual([0, 31, 62, 93])
    expect(h.bins.map((b) => [b.kept, b.cut])).toEqual([[3, 0], [0, 0], [0, 1], [0, 2]])
    expect(h.peak).toBe(3)
  })

  it('reaches past a max length longer than every row, so its marker has a place', () => {
    const h = lengthHistogram([5, 6, 7], 10, 4)
    expect(h.truncated).toBe(0)
    expect(h.bins.at(-1)!.to).toBeGreaterThan(7)
  })

  it('copes with no rows', () => {
    expect(lengthHistogram([], 2048)).toMatchObject({ truncated: 0, total: 0, peak: 0 })
  })
})

describe('deviceFits', () => {
  const workers = healthFixture().workers // an 141 GiB H200 and a 24 GiB CPU worker

  it('judges a GPU estimate against the GPUs only', () => {
    const fits = deviceFits(100 * GIB, 'cuda', workers)
    expect(fits.map((f) => f.fits)).toEqual([true, null])
    expect(fits[0]!.share).toBeCloseTo(100 / 141)
    expect(deviceFits(150 * GIB, 'cuda', workers)[0]!.fits).toBe(false)
  })

  it('judges a CPU estimate against the CPU workers, and nothing without an estimate', () => {
    expect(deviceFits(30 * GIB, 'cpu', workers).map((f) => f.fits)).toEqual([null, false])
    expect(deviceFits(null, 'cuda', workers).map((f) => f.fits)).toEqual([null, null])
  })
})
