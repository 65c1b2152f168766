import { describe, expect, it } from 'vitest'
import { buildSweep, newSweepForm, plannedRuns, splitSweepErrors, SWEPT_FIELDS, validateSweepForm } from './sweepForm'

describe('the sweep form', () => {
  it('offers the fields the API sweeps', () => {
    expect(SWEPT_FIELDS).toContain('hyperparameters.learning_rate')
    expect(SWEPT_FIELDS).toContain('lora.rank')
    expect(SWEPT_FIELDS).not.toContain('model')
  })

  it('builds the body from values and ranges', () => {
    const form = { ...newSweepForm(), strategy: 'random' as const, budget: '3', seed: '5',
      rows: [{ field: 'hyperparameters.lr_scheduler', mode: 'values' as const, values: 'cosine, linear', low: '', high: '', log: false },
        { field: 'hyperparameters.learning_rate', mode: 'range' as const, values: '', low: '1e-5', high: '1e-3', log: true }] }
    expect(validateSweepForm(form)).toEqual({})
    const body = buildSweep(form, { method: 'lora' }, ' ')
    expect(body.parameters).toEqual([
      { field: 'hyperparameters.lr_scheduler', values: ['cosine', 'linear'], log: false },
      { field: 'hyperparameters.learning_rate', low: 1e-5, high: 1e-3, log: true }])
    expect([body.name, body.budget, body.seed, body.base]).toEqual([null, 3, 5, { method: 'lora' }])
    expect(plannedRuns(form)).toBe(3)
  })

  it('counts a grid and flags what is missing', () => {
    const form = { ...newSweepForm(), budget: '0' }
    form.rows = [...form.rows, { field: 'lora.rank', mode: 'values', values: '4, 8, 16', low: '', high: '', log: false }]
    expect(plannedRuns(form)).toBe(6)
    form.rows[1]!.values = ' , '
    expect(validateSweepForm(form)).toEqual({ 'parameters.1.values': 'Give one value or more, separated by commas.',
      budget: 'A whole number of runs, 1 or more.' })
  })

  it('puts the base spec\'s errors on the form\'s own fields', () => {
    expect(splitSweepErrors({ 'base.dataset_id': 'no dataset 9', 'parameters.0.values': 'too big', '': 'over budget' }))
      .toEqual({ job: { dataset_id: 'no dataset 9' }, sweep: { 'parameters.0.values': 'too big', '': 'over budget' } })
  })
})
