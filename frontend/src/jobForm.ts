/**
 * The New fine-tune form as plain data: its fields (with help text and the same bounds the API's
 * JobSpec checks), validation, presets, and the JobSpec it sends. Values are kept as the strings
 * the inputs hold, keyed by the API's field path ("hyperparameters.learning_rate"), so a 422 from
 * the server lands on the same field as a client-side check.
 */
import type { Method } from './types'

export type FieldType = 'int' | 'float' | 'select' | 'bool'
export type Section = 'training' | 'lora' | 'preference' | 'run'

export interface FieldDef {
  path: string
  label: string
  help: string
  type: FieldType
  section: Section
  advanced?: boolean
  min?: number
  minExclusive?: boolean
  max?: number
  maxExclusive?: boolean
  /** Empty is allowed (the server picks). */
  optional?: boolean
  options?: string[]
  /** Shown as the placeholder of an optional field. */
  placeholder?: string
  /** Only these methods have the field (default: as its section says). */
  methods?: Method[]
}

export const ADAPTER_METHODS: Method[] = ['lora', 'qlora']
export const PREFERENCE_METHODS: Method[] = ['dpo', 'orpo', 'kto']
export const WHOLE_MODEL_METHODS: Method[] = ['full', 'pretrain']

export const METHODS: { value: Method; label: string; help: string }[] = [
  { value: 'lora', label: 'LoRA', help: 'Trains small adapter matrices; the base model stays frozen. Fast, light, the usual choice.' },
  { value: 'qlora', label: 'QLoRA', help: 'LoRA on a 4-bit base model: about a third of the memory. Needs a GPU.' },
  { value: 'full', label: 'Full fine-tune', help: 'Trains every weight. Most memory; use a small learning rate.' },
  { value: 'pretrain', label: 'Continued pretraining', help: 'Plain next-token training on raw text (a "text" column).' },
  { value: 'dpo', label: 'DPO', help: 'Preference tuning on prompt / chosen / rejected pairs.' },
  { value: 'orpo', label: 'ORPO', help: 'Preference tuning without a reference model, on chosen / rejected pairs.' },
  { value: 'kto', label: 'KTO', help: 'Preference tuning on single answers labelled good or bad.' },
]

/** The API's learning rate when none is given (backend/schemas/jobs.py DEFAULT_LEARNING_RATE). */
export const DEFAULT_LEARNING_RATE: Record<Method, number> = {
  lora: 2e-4, qlora: 2e-4, full: 2e-5, pretrain: 1e-4, dpo: 5e-6, orpo: 8e-6, kto: 5e-6,
}

export const FIELDS: FieldDef[] = [
  { path: 'hyperparameters.learning_rate', label: 'Learning rate', type: 'float', section: 'training', min: 0, minExclusive: true, max: 1, optional: true,
    help: 'How big each update is. Empty uses the method’s default; too high diverges, too low learns nothing.' },
  { path: 'hyperparameters.epochs', label: 'Epochs', type: 'float', section: 'training', min: 0, minExclusive: true, max: 100,
    help: 'Passes over the dataset. 1–3 is typical; more risks memorising it.' },
  { path: 'hyperparameters.max_steps', label: 'Max steps', type: 'int', section: 'training', min: 1, max: 10_000_000, optional: true, placeholder: 'from epochs',
    help: 'Stop after this many optimizer steps; overrides epochs when set. Handy for a quick trial.' },
  { path: 'hyperparameters.batch_size', label: 'Batch size', type: 'int', section: 'training', min: 1, max: 1024,
    help: 'Rows per device per step. Larger is faster until memory runs out.' },
  { path: 'hyperparameters.gradient_accumulation', label: 'Gradient accumulation', type: 'int', section: 'training', min: 1, max: 1024,
    help: 'Steps whose gradients add up before one update: effective batch = batch size × this.' },
  { path: 'hyperparameters.max_seq_len', label: 'Max sequence length', type: 'int', section: 'training', min: 16, max: 131_072,
    help: 'Tokens per row; longer rows are cut. Memory grows with it.' },
  { path: 'lora.rank', label: 'LoRA rank', type: 'int', section: 'lora', min: 1, max: 1024,
    help: 'Size of the adapter matrices. 8–64 is typical; higher learns more and uses more memory.' },
  { path: 'lora.alpha', label: 'LoRA alpha', type: 'float', section: 'lora', min: 0, minExclusive: true, max: 4096,
    help: 'Scales the adapter’s effect (alpha / rank). Twice the rank is a common start.' },
  { path: 'preference.beta', label: 'Beta', type: 'float', section: 'preference', min: 0, minExclusive: true, max: 10,
    help: 'How far the model may drift from the reference. Lower allows more; 0.1 is the usual start.' },
  // Advanced
  { path: 'hyperparameters.warmup_ratio', label: 'Warmup ratio', type: 'float', section: 'training', advanced: true, min: 0, max: 1, maxExclusive: true,
    help: 'Share of the run during which the learning rate ramps up from 0.' },
  { path: 'hyperparameters.lr_scheduler', label: 'Learning-rate schedule', type: 'select', section: 'training', advanced: true,
    options: ['cosine', 'linear', 'constant', 'constant_with_warmup'], help: 'How the learning rate decays after warmup.' },
  { path: 'hyperparameters.weight_decay', label: 'Weight decay', type: 'float', section: 'training', advanced: true, min: 0, max: 1,
    help: 'Pulls weights toward zero each step; 0 is fine for LoRA.' },
  { path: 'hyperparameters.precision', label: 'Precision', type: 'select', section: 'training', advanced: true,
    options: ['auto', 'bf16', 'fp16', 'fp32'], help: 'Number format of training. Auto picks bf16 on GPUs that have it, fp32 on the CPU.' },
  { path: 'hyperparameters.gradient_checkpointing', label: 'Gradient checkpointing', type: 'bool', section: 'training', advanced: true,
    help: 'Recomputes activations instead of storing them: less memory, about 20% slower.' },
  { path: 'hyperparameters.packing', label: 'Pack short rows together', type: 'bool', section: 'training', advanced: true,
    help: 'Puts several rows in one sequence, each attending only to itself, so no compute goes to padding: faster on short rows. Not for preference methods.' },
  { path: 'hyperparameters.eval_fraction', label: 'Evaluation share', type: 'float', section: 'training', advanced: true, min: 0, max: 0.5,
    help: 'Share of rows held out to measure eval loss; 0 skips evaluation.' },
  { path: 'hyperparameters.before_after_eval', label: 'Before/after evaluation', type: 'bool', section: 'training', advanced: true,
    help: 'After training, the base and the trained model answer held-out prompts side by side (takes a few minutes more).' },
  { path: 'hyperparameters.use_kernels', label: 'Lanner kernels', type: 'bool', section: 'training', advanced: true,
    help: 'Our Triton kernels: faster and lighter, same results. Off runs plain PyTorch + PEFT, for comparison.' },
  { path: 'hyperparameters.oom_retry', label: 'Retry when out of memory', type: 'bool', section: 'training', advanced: true,
    help: 'On out of memory, resume once from the last checkpoint at half the batch and twice the accumulation.' },
  { path: 'hyperparameters.memory_budget_gib', label: 'Memory budget (GiB)', type: 'float', section: 'training', advanced: true, min: 0, minExclusive: true, max: 4096, optional: true,
    placeholder: 'recompute every layer', methods: ADAPTER_METHODS,
    help: 'GPU memory a training step may use. The kernels’ memory engine keeps the activations dearest to recompute while they fit: more memory, faster steps. Needs Lanner kernels and gradient checkpointing.' },
  { path: 'hyperparameters.offload_checkpoints', label: 'Offload checkpoints to host memory', type: 'bool', section: 'training', advanced: true, methods: ADAPTER_METHODS,
    help: 'Each layer’s checkpointed input waits in host memory, copied while the GPU computes: the smallest footprint, about as fast. Off: only when the memory budget needs it. GPU only.' },
  { path: 'hyperparameters.save_steps', label: 'Checkpoint every', type: 'int', section: 'training', advanced: true, min: 1, optional: true, placeholder: 'end of each epoch',
    help: 'Steps between checkpoints, which a retry can resume from.' },
  { path: 'hyperparameters.seed', label: 'Seed', type: 'int', section: 'training', advanced: true, min: 0, max: 2 ** 32 - 1,
    help: 'Makes the shuffle and initialisation repeatable.' },
  { path: 'lora.dropout', label: 'LoRA dropout', type: 'float', section: 'lora', advanced: true, min: 0, max: 1, maxExclusive: true,
    help: 'Randomly drops adapter inputs while training; 0.05 can help small datasets.' },
  { path: 'gpus', label: 'GPUs', type: 'int', section: 'run', advanced: true, min: 0, max: 8,
    help: '0 runs on a CPU worker (slow, fine for the built-in model). More than 1 is not scheduled yet.' },
  { path: 'priority', label: 'Priority', type: 'int', section: 'run', advanced: true, min: -10, max: 10,
    help: 'Higher runs first; above 0 is for admins.' },
]

export type PresetName = 'quick' | 'balanced' | 'thorough' | 'custom'

/** The API's presets (backend/schemas/jobs.py PRESETS), over the defaults of the other fields. */
export const PRESETS: Record<Exclude<PresetName, 'custom'>, { label: string; help: string; values: Record<string, string> }> = {
  quick: { label: 'Quick', help: '1 epoch, short sequences: a first look in minutes.',
    values: { 'hyperparameters.epochs': '1', 'hyperparameters.batch_size': '4', 'hyperparameters.gradient_accumulation': '1', 'hyperparameters.max_seq_len': '1024' } },
  balanced: { label: 'Balanced', help: '3 epochs, effective batch 16: a solid default.',
    values: { 'hyperparameters.epochs': '3', 'hyperparameters.batch_size': '4', 'hyperparameters.gradient_accumulation': '4', 'hyperparameters.max_seq_len': '2048' } },
  thorough: { label: 'Thorough', help: '5 epochs, effective batch 64, long sequences, more warmup.',
    values: { 'hyperparameters.epochs': '5', 'hyperparameters.batch_size': '8', 'hyperparameters.gradient_accumulation': '8', 'hyperparameters.max_seq_len': '4096', 'hyperparameters.warmup_ratio': '0.05' } },
}

export interface JobForm {
  method: Method
  /** builtin/…, a hub id, or an absolute path. */
  model: string
  datasetId: string
  name: string
  preset: PresetName
  values: Record<string, string>
}

export const DEFAULT_VALUES: Record<string, string> = {
  'hyperparameters.learning_rate': '',
  'hyperparameters.epochs': '3',
  'hyperparameters.max_steps': '',
  'hyperparameters.batch_size': '4',
  'hyperparameters.gradient_accumulation': '4',
  'hyperparameters.max_seq_len': '2048',
  'hyperparameters.warmup_ratio': '0.03',
  'hyperparameters.lr_scheduler': 'cosine',
  'hyperparameters.weight_decay': '0',
  'hyperparameters.precision': 'auto',
  'hyperparameters.gradient_checkpointing': 'true',
  'hyperparameters.packing': 'false',
  'hyperparameters.eval_fraction': '0',
  'hyperparameters.save_steps': '',
  'hyperparameters.before_after_eval': 'true',
  'hyperparameters.use_kernels': 'true',
  'hyperparameters.oom_retry': 'true',
  'hyperparameters.memory_budget_gib': '',
  'hyperparameters.offload_checkpoints': 'false',
  'hyperparameters.seed': '42',
  'lora.rank': '16',
  'lora.alpha': '32',
  'lora.dropout': '0',
  'preference.beta': '0.1',
  gpus: '1',
  priority: '0',
}

export function newJobForm(model: string, gpus = 1): JobForm {
  return {
    method: 'lora',
    model,
    datasetId: '',
    name: '',
    preset: 'balanced',
    values: { ...DEFAULT_VALUES, ...PRESETS.balanced.values, gpus: String(gpus) },
  }
}

/** Puts a preset's values in (the other fields keep theirs). */
export function applyPreset(form: JobForm, preset: PresetName): JobForm {
  if (preset === 'custom') return { ...form, preset }
  return { ...form, preset, values: { ...form.values, ...PRESETS[preset].values } }
}

/** Whether a field applies to the chosen method. */
export function fieldApplies(field: FieldDef, method: Method): boolean {
  if (field.methods) return field.methods.includes(method)
  if (field.section === 'lora') return ADAPTER_METHODS.includes(method)
  if (field.section === 'preference') return PREFERENCE_METHODS.includes(method)
  return true
}

function checkNumber(field: FieldDef, raw: string): string | null {
  const text = raw.trim()
  if (text === '') return field.optional ? null : 'Enter a value.'
  const value = Number(text)
  if (!Number.isFinite(value)) return 'Enter a number, like 0.0002 or 2e-4.'
  if (field.type === 'int' && !Number.isInteger(value)) return 'Enter a whole number.'
  if (field.min != null && (field.minExclusive ? value <= field.min : value < field.min))
    return field.minExclusive ? `Must be more than ${field.min}.` : `Must be at least ${field.min}.`
  if (field.max != null && (field.maxExclusive ? value >= field.max : value > field.max))
    return field.maxExclusive ? `Must be less than ${field.max}.` : `Must be at most ${field.max}.`
  return null
}

/** Every problem with the form, by field path ("model", "dataset_id", "hyperparameters.epochs"…). */
export function validateJobForm(form: JobForm): Record<string, string> {
  const errors: Record<string, string> = {}
  const model = form.model.trim()
  if (!model) errors.model = 'Choose a model.'
  else if (!model.startsWith('builtin/') && !model.startsWith('/') && !/^[A-Za-z0-9][\w.-]*\/[A-Za-z0-9][\w.-]*$/.test(model))
    errors.model = 'Give an absolute folder path on the server (starting with /) or a hub id like Qwen/Qwen2.5-0.5B.'
  else if (model.startsWith('/') && model.split('/').includes('..')) errors.model = 'A model path may not contain “..”.'
  if (!form.datasetId) errors.dataset_id = 'Choose or upload a dataset.'
  if (form.name.length > 200) errors.name = 'Keep the name under 200 characters.'
  for (const field of FIELDS) {
    if (!fieldApplies(field, form.method) || field.type === 'select' || field.type === 'bool') continue
    const problem = checkNumber(field, form.values[field.path] ?? '')
    if (problem) errors[field.path] = problem
  }
  const lr = form.values['hyperparameters.learning_rate']?.trim()
  if (!errors['hyperparameters.learning_rate'] && lr && WHOLE_MODEL_METHODS.includes(form.method) && Number(lr) > 1e-3)
    errors['hyperparameters.learning_rate'] = `${lr} would wreck a ${form.method} run: use at most 1e-3.`
  if (form.values['hyperparameters.packing'] === 'true' && PREFERENCE_METHODS.includes(form.method))
    errors['hyperparameters.packing'] = `Packing does not apply to ${form.method}: preference pairs are never packed.`
  const engineNeeds = form.values['hyperparameters.use_kernels'] !== 'true' ? 'Lanner kernels'
    : form.values['hyperparameters.gradient_checkpointing'] !== 'true' ? 'gradient checkpointing' : null
  if (engineNeeds && ADAPTER_METHODS.includes(form.method)) {
    const budget = 'hyperparameters.memory_budget_gib', offload = 'hyperparameters.offload_checkpoints'
    if (form.values[budget]?.trim() && !errors[budget]) errors[budget] = `The memory budget needs ${engineNeeds} on.`
    if (form.values[offload] === 'true') errors[offload] = `Offloading checkpoints needs ${engineNeeds} on.`
  }
  if (form.method === 'qlora' && form.values.gpus?.trim() === '0')
    errors.gpus = 'QLoRA needs a GPU (4-bit weights): set GPUs to 1, or use LoRA.'
  return errors
}

function parsed(field: FieldDef, raw: string): number | boolean | string | null {
  if (field.type === 'bool') return raw === 'true'
  if (field.type === 'select') return raw
  const text = raw.trim()
  return text === '' ? null : Number(text)
}

/** The JobSpec for POST /api/jobs. Assumes validateJobForm found nothing. */
export function buildJobSpec(form: JobForm): Record<string, unknown> {
  const hyperparameters: Record<string, unknown> = {}
  const lora: Record<string, unknown> = {}
  const preference: Record<string, unknown> = {}
  const spec: Record<string, unknown> = {
    method: form.method,
    model: form.model.trim(),
    dataset_id: Number(form.datasetId),
  }
  if (form.name.trim()) spec.name = form.name.trim()
  if (form.preset !== 'custom') spec.preset = form.preset
  for (const field of FIELDS) {
    if (!fieldApplies(field, form.method)) continue
    const value = parsed(field, form.values[field.path] ?? '')
    if (value === null) continue
    const [group, key] = field.path.includes('.') ? field.path.split('.') : [null, field.path]
    if (group === 'hyperparameters') hyperparameters[key!] = value
    else if (group === 'lora') lora[key!] = value
    else if (group === 'preference') preference[key!] = value
    else spec[key!] = value
  }
  spec.hyperparameters = hyperparameters
  if (ADAPTER_METHODS.includes(form.method)) spec.lora = lora
  if (PREFERENCE_METHODS.includes(form.method)) spec.preference = preference
  return spec
}

/** A form filled from an existing job's config (Clone). */
export function formFromConfig(config: Record<string, unknown>, fallbackModel: string): JobForm {
  const method = (typeof config.method === 'string' ? config.method : 'lora') as Method
  const values: Record<string, string> = { ...DEFAULT_VALUES }
  for (const field of FIELDS) {
    const [group, key] = field.path.includes('.') ? field.path.split('.') : [null, field.path]
    const source = group ? (config[group] as Record<string, unknown> | null | undefined) : config
    const value = source?.[key!]
    if (value === undefined || value === null) continue
    values[field.path] = String(value)
  }
  return {
    method,
    model: typeof config.model === 'string' ? config.model : fallbackModel,
    datasetId: config.dataset_id != null ? String(config.dataset_id) : '',
    name: typeof config.name === 'string' ? `${config.name} (copy)`.slice(0, 200) : '',
    preset: 'custom',
    values,
  }
}

/** Optimizer steps the run will take, when it can be told in advance. */
export function estimatedSteps(form: JobForm, usableRows: number | null): number | null {
  const maxSteps = Number(form.values['hyperparameters.max_steps'])
  if (form.values['hyperparameters.max_steps']?.trim() && Number.isFinite(maxSteps)) return maxSteps
  if (!usableRows) return null
  const batch = Number(form.values['hyperparameters.batch_size']) * Number(form.values['hyperparameters.gradient_accumulation'])
  const epochs = Number(form.values['hyperparameters.epochs'])
  const evalShare = Number(form.values['hyperparameters.eval_fraction'] || 0)
  if (!(batch > 0) || !(epochs > 0)) return null
  const trainRows = Math.max(1, Math.round(usableRows * (1 - evalShare)))
  return Math.ceil(Math.ceil(trainRows / batch) * epochs)
}
