import { describe, expect, it } from 'vitest'
import type { MetricColumns } from './jobEvents'
import { routerBalanceData } from './routerCharts'

function columns(values: Record<string, unknown>[]): MetricColumns {
  const none = values.map(() => null)
  return { t: values.map((_, i) => i * 10), step: values.map((v) => Number(v.step)), loss: none, evalLoss: none,
    learningRate: none, gradNorm: none, tokensPerSecond: none, values }
}

describe('router load balance chart', () => {
  it('charts each step’s aux loss and busiest expert, with gaps where a point has none (an evaluation)', () => {
    const metrics = columns([
      { step: 1, loss: 2.1, router_aux_loss: 1.02, router_max_load: 1.4 },
      { step: 1, eval_loss: 2.0 },
      { step: 2, loss: 1.9, router_aux_loss: 1.5, router_max_load: 2 },
    ])
    expect(routerBalanceData(metrics)).toEqual([[0, 10, 20], [1.02, null, 1.5], [1.4, null, 2]])
  })

  it('is absent for a dense model’s job', () => {
    expect(routerBalanceData(columns([{ step: 1, loss: 2.1 }, { step: 2, loss: 1.9 }]))).toBeNull()
  })
})
