import { describe, expect, it } from 'vitest'
import type { MetricColumns } from './jobEvents'
import { accuracyData, heldOutAccuracy } from './rewardModelCharts'

function columns(values: Record<string, unknown>[]): MetricColumns {
  const none = values.map(() => null)
  return { t: values.map((_, i) => i * 10), step: values.map((v) => Number(v.step)), loss: none, evalLoss: none,
    learningRate: none, gradNorm: none, tokensPerSecond: none, values }
}

describe('reward model charts', () => {
  const metrics = columns([
    { step: 1, loss: 0.7, accuracy: 0.5 },
    { step: 2, eval_loss: 0.6, eval_accuracy: 0.5 },
    { step: 3, loss: 0.2, accuracy: 1 },
    { step: 4, eval_loss: 0.1, eval_accuracy: 0.83 },
    { step: 5, loss: 0.1, accuracy: 1 },
  ])

  it('reads the newest held-out accuracy', () => {
    expect(heldOutAccuracy(metrics)).toEqual({ step: 4, accuracy: 0.83 })
    expect(heldOutAccuracy(columns([{ step: 1, loss: 0.7, accuracy: 0.5 }]))).toBeNull()
  })

  it('charts training and held-out accuracy on the time axis', () => {
    expect(accuracyData(metrics)).toEqual([[0, 10, 20, 30, 40], [0.5, null, 1, null, 1], [null, 0.5, null, 0.83, null]])
  })
})
