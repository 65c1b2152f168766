import { describe, expect, it } from 'vitest'
import { grpoCharts } from './grpoCharts'
import { applyJobEvents, emptyJobLive } from './jobEvents'
import type { StreamEvent } from '../types'

const STEP = {
  step: 1, loss: 0.1, reward: 1.5, reward_std: 0.5, 'rewards/fmt/mean': 1, 'rewards/fmt/std': 0,
  'rewards/mine/mean': 0.25, 'rewards/mine/std': 0.4, kl: 0.002, 'completions/mean_length': 7,
  frac_reward_zero_std: 0.5, generation_time: 2, reward_time: 0.1, training_time: 0.4,
}

function events(): StreamEvent[] {
  return [
    { id: '1000-0', type: 'metric', data: { step: 0, eval_loss: 1 } },  // an eval row has no reward
    { id: '2000-0', type: 'metric', data: STEP },
    { id: '3000-0', type: 'completions', data: { step: 1, samples: [{ prompt: 'q', completion: 'a', rewards: { fmt: 1, mine: null }, advantage: 0.7 }] } },
  ] as StreamEvent[]
}

describe('GRPO on the job page', () => {
  it('charts each reward function, the KL, the length, the flat groups and the time split from the metric events', () => {
    const live = applyJobEvents(emptyJobLive(), events())
    const charts = Object.fromEntries(grpoCharts(live.metrics).map((c) => [c.key, c]))
    expect(charts['per-function']!.labels).toEqual(['fmt', 'mine'])
    expect(charts['per-function']!.data).toEqual([[1], [1], [0.25]])
    expect(charts['per-function-std']!.data).toEqual([[1], [0], [0.4]])
    expect(charts.reward!.data).toEqual([[1], [1.5], [0.5]])
    expect(charts.kl!.data[1]).toEqual([0.002])
    expect(charts['zero-std']!.data[1]).toEqual([0.5])
    expect(charts.time!.labels).toEqual(['generation', 'rewards', 'training'])
    expect(charts.time!.data.slice(1)).toEqual([[2], [0.1], [0.4]])
  })

  it('keeps the sampled completions of each step, and a replay adds none twice', () => {
    const once = applyJobEvents(emptyJobLive(), events())
    expect(once.completions).toEqual([events()[2]!.data])
    expect(applyJobEvents(once, events()).completions).toHaveLength(1)
  })

  it('draws nothing for a run without rewards', () => {
    expect(grpoCharts(applyJobEvents(emptyJobLive(), [events()[0]!]).metrics)).toEqual([])
  })
})
