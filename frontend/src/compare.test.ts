import { describe, expect, it } from 'vitest'
import { configRows, overlay, parseJobIds } from './compare'
import type { Job, MetricRow } from './types'

const m = (step: number, values: Record<string, unknown>): MetricRow => ({ step, time: '2026-11-29T12:00:00Z', values })

function job(id: number, config: Record<string, unknown>): Job {
  return { id, config } as Job
}

describe('overlay', () => {
  it('puts several runs on the union of their steps, null where a run has no value', () => {
    const a = [m(1, { loss: 3 }), m(2, { loss: 2.5 }), m(2, { eval_loss: 2.8 }), m(3, { loss: 2 })]
    const b = [m(1, { loss: 3.1 }), m(4, { loss: 1.9 })]
    expect(overlay([a, b], 'loss')).toEqual([[1, 2, 3, 4], [3, 2.5, 2, null], [3.1, null, null, 1.9]])
    expect(overlay([a, b], 'eval_loss')).toEqual([[2], [2.8], [null]])
  })

  it('gives empty columns when no run has the metric', () => {
    expect(overlay([[m(1, { loss: 1 })]], 'learning_rate')).toEqual([[], []])
  })
})

describe('configRows', () => {
  it('flattens the specs side by side and marks the settings that differ', () => {
    const rows = configRows([
      job(1, { method: 'lora', model: 'builtin/x', name: 'a', hyperparameters: { learning_rate: 2e-4, epochs: 1 }, lora: { rank: 16, target_modules: 'all-linear' }, lora_r: 16 }),
      job(2, { method: 'lora', model: 'builtin/x', name: 'b', hyperparameters: { learning_rate: 1e-4, epochs: 1 }, lora: { rank: 16, target_modules: ['q_proj', 'v_proj'] } }),
    ])
    const byKey = Object.fromEntries(rows.map((r) => [r.key, r]))
    expect(byKey['hyperparameters.learning_rate']).toEqual({ key: 'hyperparameters.learning_rate', values: ['0.0002', '0.0001'], differs: true })
    expect(byKey['hyperparameters.epochs']!.differs).toBe(false)
    expect(byKey['lora.target_modules']!.values).toEqual(['all-linear', 'q_proj, v_proj'])
    expect(byKey.name).toBeUndefined() // names differ by design; not a setting
    expect(byKey.lora_r).toBeUndefined() // the flat copy for the worker is not shown twice
  })

  it('marks a setting that only one job has', () => {
    const rows = configRows([job(1, { method: 'dpo', preference: { beta: 0.1 } }), job(2, { method: 'lora' })])
    expect(rows.find((r) => r.key === 'preference.beta')).toEqual({ key: 'preference.beta', values: ['0.1', '—'], differs: true })
  })
})

describe('parseJobIds', () => {
  it('keeps unique positive integers in order', () => {
    expect(parseJobIds('3, 5,x,3,-1,8')).toEqual([3, 5, 8])
    expect(parseJobIds(null)).toEqual([])
  })
})

describe('GRPO runs side by side', () => {
  it('overlays their rewards and shows their reward functions as a setting', () => {
    expect(overlay([[m(1, { loss: 0.1, reward: 0.5 }), m(2, { reward: 1 })], []], 'reward')).toEqual([[1, 2], [0.5, 1], [null, null]])
    const grpo = (id: number, functions: unknown[]) => job(id, { method: 'grpo', grpo: { reward_functions: functions } })
    const row = configRows([grpo(1, [{ kind: 'regex', pattern: 'a' }]), grpo(2, [{ kind: 'exact_match' }])])
      .find((r) => r.key === 'grpo.reward_functions')!
    expect(row).toEqual({ key: 'grpo.reward_functions', values: ['[{"kind":"regex","pattern":"a"}]', '[{"kind":"exact_match"}]'], differs: true })
  })
})
