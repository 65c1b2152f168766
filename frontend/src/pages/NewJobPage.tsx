import { useEffect, useMemo, useState, type FormEvent } from 'react'
import { useNavigate, useSearchParams } from 'react-router'
import { ApiError, fieldErrors, getJson, issuesByField, postJson } from '../api'
import { ConfigFileLoader } from '../components/ConfigFileLoader'
import { DatasetInsights } from '../components/DatasetInsights'
import { DatasetReport, formatName } from '../components/DatasetReport'
import { DatasetUpload } from '../components/DatasetUpload'
import { ErrorNotice, errorText, Field } from '../components/Field'
import { MemoryEstimatePanel } from '../components/MemoryEstimatePanel'
import { ModelSearch } from '../components/ModelSearch'
import { PageHeader } from '../components/PageHeader'
import { RewardFunctionsEditor } from '../components/RewardFunctionsEditor'
import { SweepPanel } from '../components/SweepPanel'
import { TrackerChoice } from '../components/TrackerChoice'
import { formatParameters } from '../format'
import { useHealth } from '../health'
import {
  applyPreset, buildJobSpec, DEFAULT_LEARNING_RATE, estimatedSteps, fieldApplies, FIELDS, formFromConfig,
  METHODS, newJobForm, PRESETS, RL_METHODS, showsTargetChoice, TARGET_CHOICE_TEXTS, TARGET_CHOICES, targetChoice,
  validateJobForm, type FieldDef, type JobForm, type PresetName, type TargetChoice,
} from '../jobForm'
import { buildSweep, newSweepForm, plannedRuns, splitSweepErrors, validateSweepForm, type SweepForm } from '../sweepForm'
import type { Catalog, CatalogModel, Dataset, Job, DatasetPage, Method, ParsedConfig, Sweep } from '../types'

const BUILTIN = 'builtin/SmolLM2-135M-Instruct'
type ModelSource = 'builtin' | 'curated' | 'search' | 'local' | 'path'

function sourceOf(model: string, catalog: Catalog | null): ModelSource {
  if (model.startsWith('builtin/')) return 'builtin'
  if (catalog?.local.some((m) => m.id === model)) return 'local'
  if (model.startsWith('/')) return 'path'
  if (catalog && !catalog.curated.some((m) => m.id === model)) return 'search'
  return 'curated'
}

function modelOptionLabel(m: CatalogModel): string {
  const size = m.parameters ? ` · ${formatParameters(m.parameters)}` : ''
  return `${m.name ?? m.id}${size}${m.gated ? ' · gated (needs hub access)' : ''}`
}

export function NewJobPage() {
  const navigate = useNavigate()
  const [params] = useSearchParams()
  const cloneId = params.get('clone')
  const health = useHealth()
  const hasGpu = !!health.health?.workers.some((w) => w.device.kind === 'cuda')
  const initialModel = params.get('model') || BUILTIN
  const [form, setForm] = useState<JobForm>(() => newJobForm(initialModel, 0))
  const [gpusTouched, setGpusTouched] = useState(false)
  const [catalog, setCatalog] = useState<Catalog | null>(null)
  const [catalogError, setCatalogError] = useState<string | null>(null)
  const [datasets, setDatasets] = useState<Dataset[] | null>(null)
  const [datasetsError, setDatasetsError] = useState<string | null>(null)
  const [source, setSource] = useState<ModelSource>(() => sourceOf(initialModel, null))
  const [pathText, setPathText] = useState(initialModel.startsWith('/') ? initialModel : '')
  const [touched, setTouched] = useState(false)
  const [serverErrors, setServerErrors] = useState<Record<string, string>>({})
  const [launchError, setLaunchError] = useState<string | null>(null)
  const [reviewing, setReviewing] = useState(false)
  const [launching, setLaunching] = useState(false)
  const [advancedOpen, setAdvancedOpen] = useState(false)
  const [sweep, setSweep] = useState<SweepForm>(newSweepForm)
  const [sweepServerErrors, setSweepServerErrors] = useState<Record<string, string>>({})
  // The chosen model's routed experts per MoE layer, as the memory estimate read them from its config.
  const [experts, setExperts] = useState<number | null>(null)

  // eslint-disable-next-line react-hooks/exhaustive-deps
  useEffect(() => {
    getJson<Catalog>('/api/models')
      .then((c) => {
        setCatalog(c)
        if (initialModel !== BUILTIN) setSource(sourceOf(initialModel, c))
      }).catch((err) => setCatalogError(errorText(err)))
    void loadDatasets()
  }, [])

  useEffect(() => {
    if (!cloneId) return
    getJson<Job>(`/api/jobs/${cloneId}`)
      .then((job) => {
        const next = formFromConfig(job.config, BUILTIN)
        setForm(next)
        setGpusTouched(true)
        setSource(sourceOf(next.model, null))
        if (next.model.startsWith('/')) setPathText(next.model)
      })
      .catch((err) => setLaunchError(`Could not load job ${cloneId} to copy it: ${errorText(err)}`))
  }, [cloneId])

  function loadConfig(parsed: ParsedConfig) {
    const next = formFromConfig(parsed.spec, BUILTIN, false)
    // a file without a dataset (an imported config) keeps the one picked here
    setForm((f) => ({ ...next, datasetId: next.datasetId || f.datasetId }))
    setGpusTouched(true)
    setSource(sourceOf(next.model, catalog))
    if (next.model.startsWith('/')) setPathText(next.model)
    setServerErrors(issuesByField(parsed.errors))
    setTouched(true)
    setReviewing(false)
  }

  useEffect(() => {
    if (!gpusTouched && health.health) setForm((f) => ({ ...f, values: { ...f.values, gpus: hasGpu ? '1' : '0' } }))
  }, [hasGpu, gpusTouched, health.health])

  async function loadDatasets(select?: Dataset) {
    try {
      const page = await getJson<DatasetPage>('/api/datasets?limit=200')
      setDatasets(page.items)
      setDatasetsError(null)
      if (select) setForm((f) => ({ ...f, datasetId: String(select.id) }))
    } catch (err) {
      setDatasetsError(errorText(err))
    }
  }

  const clientErrors = touched ? validateJobForm(form) : {}
  const errors: Record<string, string> = { ...serverErrors, ...clientErrors }
  const sweepErrors: Record<string, string> = { ...sweepServerErrors, ...(touched && sweep.enabled ? validateSweepForm(sweep) : {}) }
  const dataset = datasets?.find((d) => String(d.id) === form.datasetId) ?? null
  const steps = estimatedSteps(form, dataset?.usable_rows ?? null)

  function update(change: Partial<JobForm>, clear: string[] = []) {
    setForm((f) => ({ ...f, ...change }))
    setReviewing(false)
    if (clear.length) setServerErrors((e) => Object.fromEntries(Object.entries(e).filter(([k]) => !clear.includes(k))))
  }

  function setValue(path: string, value: string) {
    setForm((f) => ({ ...f, preset: PRESETS_PATHS.has(path) ? 'custom' : f.preset, values: { ...f.values, [path]: value } }))
    if (path === 'gpus') setGpusTouched(true)
    setReviewing(false)
    setServerErrors((e) => {
      const { [path]: _gone, hyperparameters: _h, ...rest } = e
      return rest
    })
  }

  function chooseSource(next: ModelSource) {
    setSource(next)
    if (next === 'builtin') update({ model: catalog?.default.id ?? BUILTIN }, ['model'])
    else if (next === 'curated') update({ model: catalog?.curated[0]?.id ?? '' }, ['model'])
    else if (next === 'search') update({ model: '' }, ['model'])
    else if (next === 'local') update({ model: catalog?.local[0]?.id ?? '' }, ['model'])
    else update({ model: pathText }, ['model'])
  }

  function review(event: FormEvent) {
    event.preventDefault()
    setTouched(true)
    const problems = validateJobForm(form)
    if (sweep.enabled && Object.keys(validateSweepForm(sweep)).length > 0) {
      setLaunchError('The sweep needs fixing: see its fields marked in red.')
      return
    }
    if (Object.keys(problems).length > 0) {
      if (FIELDS.some((f) => f.advanced && problems[f.path])) setAdvancedOpen(true)
      setLaunchError('Some settings need fixing: see the fields marked in red.')
      return
    }
    setLaunchError(null)
    setReviewing(true)
  }

  async function launch() {
    setLaunching(true)
    setLaunchError(null)
    try {
      if (sweep.enabled) {
        const created = await postJson<Sweep>('/api/sweeps', buildSweep(sweep, buildJobSpec(form), form.name))
        navigate(`/sweeps/${created.id}`)
        return
      }
      const job = await postJson<Job>('/api/jobs', buildJobSpec(form))
      navigate(`/jobs/${job.id}`)
    } catch (err) {
      setReviewing(false)
      if (err instanceof ApiError && err.status === 422) {
        const { job: found, sweep: sweepFound } = sweep.enabled ? splitSweepErrors(fieldErrors(err)) : { job: fieldErrors(err), sweep: {} }
        setServerErrors(found)
        setSweepServerErrors(sweepFound)
        if (FIELDS.some((f) => f.advanced && found[f.path])) setAdvancedOpen(true)
        setLaunchError(`The server did not accept these settings: ${err.message}`)
      } else setLaunchError(`Could not queue the job: ${errorText(err)}`)
    } finally {
      setLaunching(false)
    }
  }

  function renderField(field: FieldDef) {
    const value = form.values[field.path] ?? ''
    const error = errors[field.path]
    const placeholder =
      field.path === 'hyperparameters.learning_rate' ? `default ${DEFAULT_LEARNING_RATE[form.method]}` : field.placeholder
    if (field.type === 'bool') {
      return (
        <Field key={field.path} label={field.label} help={field.help} error={error} className="field--check">
          <input type="checkbox" name={field.path} checked={value === 'true'} onChange={(e) => setValue(field.path, String(e.target.checked))} />
        </Field>
      )
    }
    if (field.type === 'select') {
      return (
        <Field key={field.path} label={field.label} help={field.help} error={error}>
          <select name={field.path} value={value} onChange={(e) => setValue(field.path, e.target.value)}>
            {field.options!.map((o) => <option key={o} value={o}>{o}</option>)}
          </select>
        </Field>
      )
    }
    return (
      <Field key={field.path} label={field.label} help={field.help} error={error}>
        <input type="text" inputMode={field.type === 'int' ? 'numeric' : 'decimal'} name={field.path} value={value}
          placeholder={placeholder} onChange={(e) => setValue(field.path, e.target.value)} />
      </Field>
    )
  }

  function renderTargetChoice() {
    const chosen = targetChoice(form.targetModules)
    const error = errors['lora.target_modules']
    return (
      <Field key="lora.target_modules" label="LoRA targets" error={error}
        help={`Which projections the adapter trains.${experts ? ` This model routes each token to a few of its ${experts} experts: “Experts” adapts every expert’s gate, up and down projections.` : ''}`}>
        <select name="lora.target_modules" value={chosen ?? 'custom'}
          onChange={(e) => update({ targetModules: TARGET_CHOICES[e.target.value as TargetChoice] }, ['lora.target_modules'])}>
          {TARGET_CHOICE_TEXTS.map((c) => <option key={c.value} value={c.value}>{c.label}</option>)}
          {chosen === null && <option value="custom">As loaded: {(form.targetModules as string[]).join(', ')}</option>}
        </select>
      </Field>
    )
  }

  const visible = FIELDS.filter((f) => fieldApplies(f, form.method))
  const targetsShown = showsTargetChoice(form, experts)
  const basic = visible.filter((f) => !f.advanced)
  const advanced = visible.filter((f) => f.advanced)
  const wholeSpecError = serverErrors.hyperparameters ?? serverErrors.lora ?? serverErrors.preference ?? serverErrors.grpo ?? serverErrors['']
  const summary = useMemo(() => (reviewing ? buildJobSpec(form) : null), [reviewing, form])

  return (
    <>
      <PageHeader
        title="New fine-tune"
        description={cloneId ? `A copy of job ${cloneId}: change what you like, review, launch.` : 'Choose a model and a dataset, set the hyperparameters, review, and queue the job.'}
      />
      <ConfigFileLoader onLoaded={loadConfig} />
      <form className="new-job" onSubmit={review} noValidate aria-label="New fine-tune">
        <section className="panel" aria-labelledby="model-heading">
          <header className="panel__header"><h2 id="model-heading">1. Model</h2></header>
          <div className="panel__body form__body">
            {catalogError && <p className="error-text">Could not load the model list: {catalogError}</p>}
            <fieldset className="choices" aria-describedby="model-help">
              <legend className="visually-hidden">Where the model comes from</legend>
              {([
                ['builtin', 'Built-in SmolLM2', catalog?.default.name ?? 'SmolLM2-135M-Instruct, trains on a CPU'],
                ['curated', 'Curated list', 'Popular instruction models (downloaded from the hub on first use)'],
                ['search', 'Search the hub', 'Any text-generation model on the hub (needs network)'],
                ['local', 'On this server', `${catalog?.local.length ?? 0} model folder(s) in the data directory`],
                ['path', 'Local path', 'Any Hugging Face model folder on the server'],
              ] as [ModelSource, string, string][]).map(([value, label, hint]) => (
                <label key={value} className={`choice${source === value ? ' choice--selected' : ''}`}>
                  <input type="radio" name="model-source" value={value} checked={source === value} onChange={() => chooseSource(value)} />
                  <span className="choice__label">{label}</span>
                  <span className="choice__hint">{hint}</span>
                </label>
              ))}
            </fieldset>
            {source === 'curated' && catalog && (
              <Field label="Model" error={errors.model} help="Gated models need an access grant on the hub and a token on the server.">
                <select value={form.model} onChange={(e) => update({ model: e.target.value }, ['model'])}>
                  {catalog.curated.map((m) => <option key={m.id} value={m.id}>{m.family ? `${m.family} — ` : ''}{modelOptionLabel(m)}</option>)}
                </select>
              </Field>
            )}
            {source === 'search' && <ModelSearch chosen={form.model} onChoose={(id) => update({ model: id }, ['model'])} />}
            {source === 'search' && errors.model && <p className="error-text" role="alert">{errors.model}</p>}
            {source === 'local' && catalog && (catalog.local.length === 0
              ? <p className="muted">No model folders under the data directory yet. Use a path instead.</p>
              : (
                <Field label="Model" error={errors.model}>
                  <select value={form.model} onChange={(e) => update({ model: e.target.value }, ['model'])}>
                    {catalog.local.map((m) => <option key={m.id} value={m.id}>{m.name ?? m.id}</option>)}
                  </select>
                </Field>
              ))}
            {source === 'path' && (
              <Field label="Model folder" error={errors.model} help="Absolute path on the server to a folder with config.json and the weights.">
                <input type="text" value={pathText} placeholder="/srv/models/my-model" className="mono"
                  onChange={(e) => { setPathText(e.target.value); update({ model: e.target.value }, ['model']) }} />
              </Field>
            )}
            {(source === 'builtin') && errors.model && <p className="error-text" role="alert">{errors.model}</p>}
            <p id="model-help" className="muted small">
              Chosen: <code data-testid="chosen-model">{form.model || '—'}</code>.
            </p>
            <MemoryEstimatePanel form={form} onExperts={setExperts} />
          </div>
        </section>

        <section className="panel" aria-labelledby="method-heading">
          <header className="panel__header"><h2 id="method-heading">2. Method</h2></header>
          <div className="panel__body">
            <fieldset className="choices choices--methods">
              <legend className="visually-hidden">Training method</legend>
              {METHODS.map((m) => (
                <label key={m.value} className={`choice${form.method === m.value ? ' choice--selected' : ''}`}>
                  <input type="radio" name="method" value={m.value} checked={form.method === m.value}
                    onChange={() => update({ method: m.value as Method }, ['method', 'dataset_id'])} />
                  <span className="choice__label">{m.label}</span>
                  <span className="choice__hint">{m.help}</span>
                </label>
              ))}
            </fieldset>
            {errors.method && <p className="error-text" role="alert">{errors.method}</p>}
          </div>
        </section>

        <section className="panel" aria-labelledby="dataset-heading">
          <header className="panel__header"><h2 id="dataset-heading">3. Dataset</h2></header>
          <div className="panel__body form__body">
            {datasetsError && <p className="error-text">Could not load the datasets: {datasetsError}</p>}
            <Field label="Dataset" error={errors.dataset_id} help="Datasets uploaded by anyone on the team. Upload a new one below.">
              <select value={form.datasetId} onChange={(e) => update({ datasetId: e.target.value }, ['dataset_id'])}>
                <option value="">{datasets && datasets.length === 0 ? 'No datasets yet: upload one' : 'Choose a dataset…'}</option>
                {(datasets ?? []).map((d) => (
                  <option key={d.id} value={d.id}>{d.name} — {d.format ?? 'unknown format'}, {d.usable_rows} usable rows</option>
                ))}
              </select>
            </Field>
            <DatasetUpload onUploaded={(d) => { void loadDatasets(d); setServerErrors((e) => ({ ...e, dataset_id: '' })) }} />
            {dataset && (
              <>
                <details className="details">
                  <summary>Validation report of “{dataset.name}”: {formatName(dataset.format)}, {dataset.usable_rows} of {dataset.rows} rows usable</summary>
                  <DatasetReport report={dataset.report} />
                </details>
                <DatasetInsights dataset={dataset} model={form.model.trim()} maxSeqLen={Number(form.values['hyperparameters.max_seq_len']) || null}
                  splitsLongRows={form.method === 'pretrain'} />
              </>
            )}
          </div>
        </section>

        <section className="panel" aria-labelledby="hp-heading">
          <header className="panel__header"><h2 id="hp-heading">4. Hyperparameters</h2></header>
          <div className="panel__body form__body">
            <fieldset className="presets">
              <legend>Preset</legend>
              {(Object.entries(PRESETS) as [Exclude<PresetName, 'custom'>, (typeof PRESETS)['quick']][]).map(([key, preset]) => (
                <label key={key} className={`choice choice--inline${form.preset === key ? ' choice--selected' : ''}`} title={preset.help}>
                  <input type="radio" name="preset" value={key} checked={form.preset === key} onChange={() => { setForm((f) => applyPreset(f, key)); setReviewing(false) }} />
                  <span className="choice__label">{preset.label}</span>
                  <span className="choice__hint">{preset.help}</span>
                </label>
              ))}
              <label className={`choice choice--inline${form.preset === 'custom' ? ' choice--selected' : ''}`}>
                <input type="radio" name="preset" value="custom" checked={form.preset === 'custom'} onChange={() => update({ preset: 'custom' })} />
                <span className="choice__label">Custom</span>
                <span className="choice__hint">Your own values below.</span>
              </label>
            </fieldset>
            {wholeSpecError && <p className="error-text" role="alert">{wholeSpecError}</p>}
            <div className="field-grid">{basic.map(renderField)}{targetsShown && renderTargetChoice()}</div>
            <details className="details" open={advancedOpen} onToggle={(e) => setAdvancedOpen((e.target as HTMLDetailsElement).open)}>
              <summary>Advanced</summary>
              <div className="field-grid">{advanced.map(renderField)}</div>
            </details>
            {RL_METHODS.includes(form.method) && (
              <RewardFunctionsEditor functions={form.rewardFunctions} datasetId={form.datasetId}
                error={Object.entries(errors).filter(([path]) => path.startsWith('grpo.reward_functions'))
                  .map(([path, text]) => `${path.replace('grpo.reward_functions', 'function').replace(/\.(\d+)/, (_, i) => ` ${Number(i) + 1}`)}: ${text}`).join('; ') || undefined}
                onChange={(rewardFunctions) => update({ rewardFunctions }, ['grpo', 'grpo.reward_functions'])} />
            )}
            <Field label="Job name (optional)" error={errors.name} help="Defaults to method, model and dataset.">
              <input type="text" value={form.name} maxLength={200} onChange={(e) => update({ name: e.target.value }, ['name'])} />
            </Field>
            <TrackerChoice chosen={form.trackers} error={errors.trackers} onChange={(trackers) => update({ trackers }, ['trackers'])} />
          </div>
        </section>

        <SweepPanel form={sweep} errors={sweepErrors}
          onChange={(next) => { setSweep(next); setSweepServerErrors({}); setReviewing(false) }} />

        <ErrorNotice error={launchError} />
        {!reviewing && (
          <div className="form__actions">
            <button type="submit" className="button button--primary">Review</button>
            <span className="muted small">You see a summary before anything is queued.</span>
          </div>
        )}
        {reviewing && summary && (
          <section className="panel summary" aria-labelledby="summary-heading" data-testid="job-summary">
            <header className="panel__header"><h2 id="summary-heading">6. Summary</h2></header>
            <div className="panel__body">
              <dl className="facts facts--wide">
                <div><dt>Model</dt><dd className="mono">{form.model}</dd></div>
                <div><dt>Method</dt><dd>{METHODS.find((m) => m.value === form.method)?.label}</dd></div>
                <div><dt>Dataset</dt><dd>{dataset ? `${dataset.name} (${dataset.usable_rows} usable rows, ${dataset.format})` : `#${form.datasetId}`}</dd></div>
                <div><dt>Preset</dt><dd>{form.preset}</dd></div>
                <div><dt>Learning rate</dt><dd className="mono">{form.values['hyperparameters.learning_rate'] || `${DEFAULT_LEARNING_RATE[form.method]} (default)`}</dd></div>
                <div><dt>Effective batch</dt><dd className="mono">{Number(form.values['hyperparameters.batch_size']) * Number(form.values['hyperparameters.gradient_accumulation'])}</dd></div>
                <div><dt>Steps</dt><dd className="mono">{steps ?? '—'}</dd></div>
                <div><dt>Device</dt><dd>{form.values.gpus === '0' ? 'a CPU worker' : `${form.values.gpus} GPU`}</dd></div>
                {sweep.enabled && <div><dt>Sweep</dt><dd>{plannedRuns(sweep)} runs ({sweep.strategy}), ranked by {sweep.metric}</dd></div>}
                <div><dt>Trackers</dt><dd>{form.trackers.join(', ') || 'none'}</dd></div>
                {targetsShown && <div><dt>LoRA targets</dt><dd className="mono">{TARGET_CHOICE_TEXTS.find((c) => c.value === targetChoice(form.targetModules))?.label ?? (form.targetModules as string[]).join(', ')}</dd></div>}
                {visible.filter((f) => !['hyperparameters.learning_rate', 'gpus'].includes(f.path)).map((f) => (
                  <div key={f.path}><dt>{f.label}</dt><dd className="mono">{form.values[f.path] || '—'}</dd></div>
                ))}
              </dl>
              <div className="form__actions">
                <button type="button" className="button button--primary" onClick={() => void launch()} disabled={launching}>
                  {launching ? 'Queueing…' : sweep.enabled ? 'Launch sweep' : 'Launch'}
                </button>
                <button type="button" className="button" onClick={() => setReviewing(false)} disabled={launching}>Back to edit</button>
              </div>
            </div>
          </section>
        )}
      </form>
    </>
  )
}

/** Changing one of these by hand means the preset no longer describes the form. */
const PRESETS_PATHS = new Set(Object.values(PRESETS).flatMap((p) => Object.keys(p.values)))
