import { Field } from './Field'
import { fieldLabel, newRow, plannedRuns, SWEPT_FIELDS, type SweepForm, type SweptRow } from '../sweepForm'

interface Props {
  form: SweepForm
  onChange: (form: SweepForm) => void
  /** By the server's paths: "parameters.0.values", "budget", "" (the sweep as a whole). */
  errors: Record<string, string>
}

/** The optional sweep of the New fine-tune form: the fields to vary, the search, the budget, the metric. */
export function SweepPanel({ form, onChange, errors }: Props) {
  const set = (change: Partial<SweepForm>) => onChange({ ...form, ...change })
  const setRow = (index: number, change: Partial<SweptRow>) =>
    set({ rows: form.rows.map((row, i) => (i === index ? { ...row, ...change } : row)) })
  const runs = plannedRuns(form)

  return (
    <section className="panel" aria-labelledby="sweep-heading" data-testid="sweep-panel">
      <header className="panel__header"><h2 id="sweep-heading">5. Sweep (optional)</h2></header>
      <div className="panel__body form__body">
        <label className="check">
          <input type="checkbox" checked={form.enabled} onChange={(e) => set({ enabled: e.target.checked })} /> Run as a sweep
        </label>
        <p className="muted small">
          A sweep queues one run of the settings above per combination of the values below (grid), or a budget of
          random draws; the runs take turns in the queue with everyone else's jobs, and the sweep's page ranks them.
        </p>
        {form.enabled && (
          <>
            {errors[''] && <p className="error-text" role="alert">{errors['']}</p>}
            <div className="field-grid">
              <Field label="Search" error={errors.strategy}>
                <select value={form.strategy} onChange={(e) => set({ strategy: e.target.value as SweepForm['strategy'] })}>
                  <option value="grid">grid: every combination</option>
                  <option value="random">random: seeded draws</option>
                </select>
              </Field>
              <Field label="Budget (runs)" error={errors.budget} help="The most runs the sweep may queue.">
                <input type="text" inputMode="numeric" value={form.budget} onChange={(e) => set({ budget: e.target.value })} />
              </Field>
              {form.strategy === 'random' && (
                <Field label="Seed" error={errors.seed} help="The same seed draws the same runs.">
                  <input type="text" inputMode="numeric" value={form.seed} onChange={(e) => set({ seed: e.target.value })} />
                </Field>
              )}
              <Field label="Rank by" error={errors.metric} help="A logged metric: loss, eval_loss (needs an evaluation share)…">
                <input type="text" value={form.metric} onChange={(e) => set({ metric: e.target.value })} />
              </Field>
              <Field label="Best is" error={errors.direction}>
                <select value={form.direction} onChange={(e) => set({ direction: e.target.value as SweepForm['direction'] })}>
                  <option value="minimize">the lowest</option>
                  <option value="maximize">the highest</option>
                </select>
              </Field>
            </div>
            <table className="table table--compact" aria-label="Swept fields">
              <thead>
                <tr><th scope="col">Field</th><th scope="col">Values or range</th><th scope="col"><span className="visually-hidden">Remove</span></th></tr>
              </thead>
              <tbody>
                {form.rows.map((row, i) => (
                  <tr key={i}>
                    <td>
                      <select aria-label={`Swept field ${i + 1}`} value={row.field} onChange={(e) => setRow(i, { field: e.target.value })}>
                        {SWEPT_FIELDS.map((f) => <option key={f} value={f}>{fieldLabel(f)} ({f})</option>)}
                      </select>
                    </td>
                    <td>
                      {form.strategy === 'random' && (
                        <select aria-label={`Kind of values ${i + 1}`} value={row.mode} onChange={(e) => setRow(i, { mode: e.target.value as SweptRow['mode'] })}>
                          <option value="values">values</option>
                          <option value="range">range</option>
                        </select>
                      )}
                      {(row.mode === 'values' || form.strategy === 'grid')
                        ? <input type="text" aria-label={`Values of field ${i + 1}`} placeholder="1e-4, 2e-4, 5e-4" value={row.values}
                            onChange={(e) => setRow(i, { values: e.target.value, mode: 'values' })} />
                        : (
                          <>
                            <input type="text" aria-label={`Low end of field ${i + 1}`} placeholder="low" value={row.low} onChange={(e) => setRow(i, { low: e.target.value })} />
                            <input type="text" aria-label={`High end of field ${i + 1}`} placeholder="high" value={row.high} onChange={(e) => setRow(i, { high: e.target.value })} />
                            <label className="check small"><input type="checkbox" checked={row.log} onChange={(e) => setRow(i, { log: e.target.checked })} /> log scale</label>
                          </>
                        )}
                      {errors[`parameters.${i}.values`] && <p className="error-text" role="alert">{errors[`parameters.${i}.values`]}</p>}
                      {errors[`parameters.${i}`] && <p className="error-text" role="alert">{errors[`parameters.${i}`]}</p>}
                    </td>
                    <td>
                      <button type="button" className="button button--small" disabled={form.rows.length === 1}
                        onClick={() => set({ rows: form.rows.filter((_, j) => j !== i) })}>Remove</button>
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
            <div className="form__actions">
              <button type="button" className="button" disabled={form.rows.length >= 8}
                onClick={() => set({ rows: [...form.rows, newRow(form.rows.map((r) => r.field))] })}>Add a field</button>
              <span className="muted small" data-testid="sweep-runs">{runs} run{runs === 1 ? '' : 's'}</span>
            </div>
          </>
        )}
      </div>
    </section>
  )
}
