/**
 * The New fine-tune form as plain data: its fields, validation, presets, and the JobSpec it sends.
 * Labels, help text, sections and order are written here; each field's type, bounds, default and
 * choices, the presets' values and the learning rate of each method come from the API's OpenAPI
 * document (specSchema.ts). Values are kept as the strings the inputs hold, keyed by the API's field
 * path ("hyperparameters.learning_rate"), so a 422 from the server lands on the same field as a
 * client-side check.
 */
import { specExtension, specField } from './specSchema'
import type { Method, RewardFunction, Tracker } from './types'

export type FieldType = 'int' | 'float' | 'select' | 'bool'
export type Section = 'training' | 'lora' | 'preference' | 'grpo' | 'run'

/** What the form says about a field, written by hand. */
interface FieldText {
  path: string
  label: string
  help: string
  section: Section
  advanced?: boolean
  /** Shown as the placeholder of an optional field. */
  placeholder?: string
  /** Only these methods have the field (default: as its section says). */
  methods?: Method[]
}

/** A field of the form: its text, and what the API's schema says of it. */
export interface FieldDef extends FieldText {
  type: FieldType
  min?: number
  minExclusive?: boolean
  max?: number
  maxExclusive?: boolean
  /** Empty is allowed (the server picks). */
  optional: boolean
  options?: string[]
  /** The input's value when the form opens. */
  initial: string
}

const METHOD_GROUPS = specExtension('method', 'x-method-groups') as Record<'adapter' | 'preference' | 'whole_model' | 'rl' | 'reward_model', Method[]>
export const ADAPTER_METHODS: Method[] = METHOD_GROUPS.adapter
/** Reinforcement learning from reward functions (GRPO): an adapter, as lora, with a grpo section. */
export const RL_METHODS: Method[] = METHOD_GROUPS.rl
export const PREFERENCE_METHODS: Method[] = METHOD_GROUPS.preference
export const WHOLE_MODEL_METHODS: Method[] = METHOD_GROUPS.whole_model
/** A reward model on preference pairs: trained here as a LoRA adapter with its score head. */
export const REWARD_MODEL_METHODS: Method[] = METHOD_GROUPS.reward_model
/** Methods that train on prompt / chosen / rejected pairs, never packed. */
const PAIR_METHODS: Method[] = [...PREFERENCE_METHODS, ...REWARD_MODEL_METHODS]
/** Methods the form trains as a LoRA adapter (the lora section). */
const LORA_METHODS: Method[] = [...ADAPTER_METHODS, ...RL_METHODS, ...REWARD_MODEL_METHODS]

export const METHODS: { value: Method; label: string; help: string }[] = [
  { value: 'lora', label: 'LoRA', help: 'Trains small adapter matrices; the base model stays frozen. Fast, light, the usual choice.' },
  { value: 'qlora', label: 'QLoRA', help: 'LoRA on a 4-bit base model: about a third of the memory. Needs a GPU.' },
  { value: 'lora_fp8', label: 'LoRA, FP8 base', help: 'LoRA on a base model stored and multiplied in FP8: faster steps, about half the weight memory. Needs an FP8 GPU (Ada or Hopper).' },
  { value: 'full', label: 'Full fine-tune', help: 'Trains every weight. Most memory; use a small learning rate.' },
  { value: 'pretrain', label: 'Continued pretraining', help: 'Plain next-token training on raw text (a "text" column).' },
  { value: 'dpo', label: 'DPO', help: 'Preference tuning on prompt / chosen / rejected pairs.' },
  { value: 'orpo', label: 'ORPO', help: 'Preference tuning without a reference model, on chosen / rejected pairs.' },
  { value: 'kto', label: 'KTO', help: 'Preference tuning on single answers labelled good or bad.' },
  { value: 'grpo', label: 'GRPO', help: 'Reinforcement learning: the model answers prompts, reward functions you choose or write score the answers.' },
  { value: 'reward', label: 'Reward model', help: 'Learns to score answers from chosen / rejected pairs; a finished one can be a GRPO reward function.' },
]

/** The API's learning rate when none is given. */
export const DEFAULT_LEARNING_RATE = specExtension('hyperparameters.learning_rate', 'x-default-by-method') as Record<Method, number>

const FIELD_TEXTS: FieldText[] = [
  { path: 'hyperparameters.learning_rate', label: 'Learning rate', section: 'training',
    help: 'How big each update is. Empty uses the method’s default; too high diverges, too low learns nothing.' },
  { path: 'hyperparameters.epochs', label: 'Epochs', section: 'training',
    help: 'Passes over the dataset. 1–3 is typical; more risks memorising it.' },
  { path: 'hyperparameters.max_steps', label: 'Max steps', section: 'training', placeholder: 'from epochs',
    help: 'Stop after this many optimizer steps; overrides epochs when set. Handy for a quick trial.' },
  { path: 'hyperparameters.batch_size', label: 'Batch size', section: 'training',
    help: 'Rows per device per step. Larger is faster until memory runs out.' },
  { path: 'hyperparameters.gradient_accumulation', label: 'Gradient accumulation', section: 'training',
    help: 'Steps whose gradients add up before one update: effective batch = batch size × this.' },
  { path: 'hyperparameters.max_seq_len', label: 'Max sequence length', section: 'training',
    help: 'Tokens per row; longer rows are cut. Memory grows with it.' },
  { path: 'lora.rank', label: 'LoRA rank', section: 'lora',
    help: 'Size of the adapter matrices. 8–64 is typical; higher learns more and uses more memory.' },
  { path: 'lora.alpha', label: 'LoRA alpha', section: 'lora',
    help: 'Scales the adapter’s effect (alpha / rank). Twice the rank is a common start.' },
  { path: 'preference.beta', label: 'Beta', section: 'preference',
    help: 'How far the model may drift from the reference. Lower allows more; 0.1 is the usual start.' },
  { path: 'grpo.num_generations', label: 'Group size', section: 'grpo',
    help: 'Completions sampled per prompt; each is judged against its group. Batch size × accumulation must be a multiple of it.' },
  { path: 'grpo.max_completion_len', label: 'Max completion length', section: 'grpo',
    help: 'Tokens the model may write per completion.' },
  { path: 'grpo.temperature', label: 'Temperature', section: 'grpo',
    help: 'Sampling temperature: higher gives the group more varied answers to learn from.' },
  { path: 'grpo.beta', label: 'KL coefficient', section: 'grpo',
    help: 'How strongly the model is held near where it started; 0 drops the reference model.' },
  // Advanced
  { path: 'hyperparameters.warmup_ratio', label: 'Warmup ratio', section: 'training', advanced: true,
    help: 'Share of the run during which the learning rate ramps up from 0.' },
  { path: 'hyperparameters.lr_scheduler', label: 'Learning-rate schedule', section: 'training', advanced: true,
    help: 'How the learning rate decays after warmup.' },
  { path: 'hyperparameters.weight_decay', label: 'Weight decay', section: 'training', advanced: true,
    help: 'Pulls weights toward zero each step; 0 is fine for LoRA.' },
  { path: 'hyperparameters.precision', label: 'Precision', section: 'training', advanced: true,
    help: 'Number format of training. Auto picks bf16 on GPUs that have it, fp32 on the CPU.' },
  { path: 'hyperparameters.gradient_checkpointing', label: 'Gradient checkpointing', section: 'training', advanced: true,
    help: 'Recomputes activations instead of storing them: less memory, about 20% slower.' },
  { path: 'hyperparameters.packing', label: 'Pack short rows together', section: 'training', advanced: true,
    help: 'Puts several rows in one sequence, each attending only to itself, so no compute goes to padding: faster on short rows. Not for preference methods.' },
  { path: 'hyperparameters.eval_fraction', label: 'Evaluation share', section: 'training', advanced: true,
    help: 'Share of rows held out to measure eval loss; 0 skips evaluation.' },
  { path: 'hyperparameters.eval_steps', label: 'Evaluate every', section: 'training', advanced: true, placeholder: 'as checkpoints',
    help: 'Steps between eval-loss measurements on the held-out rows.' },
  { path: 'hyperparameters.before_after_eval', label: 'Before/after evaluation', section: 'training', advanced: true,
    help: 'After training, the base and the trained model answer held-out prompts side by side (takes a few minutes more).' },
  { path: 'hyperparameters.max_grad_norm', label: 'Gradient clipping', section: 'training', advanced: true,
    help: 'Largest gradient norm an update may have; 0 turns clipping off.' },
  { path: 'hyperparameters.completion_only_loss', label: 'Loss on answers only', section: 'training', advanced: true, methods: ['lora', 'qlora', 'lora_fp8', 'full'],
    help: 'Learns from the answers, not from the prompts they follow. Off trains on the whole conversation.' },
  { path: 'hyperparameters.use_kernels', label: 'Lanner kernels', section: 'training', advanced: true,
    help: 'Our Triton kernels: faster and lighter, same results. Off runs plain PyTorch + PEFT, for comparison.' },
  { path: 'hyperparameters.oom_retry', label: 'Retry when out of memory', section: 'training', advanced: true,
    help: 'On out of memory, resume once from the last checkpoint at half the batch and twice the accumulation.' },
  { path: 'hyperparameters.memory_budget_gib', label: 'Memory budget (GiB)', section: 'training', advanced: true,
    placeholder: 'recompute every layer', methods: ADAPTER_METHODS,
    help: 'GPU memory a training step may use. The kernels’ memory engine keeps the activations dearest to recompute while they fit: more memory, faster steps. Needs Lanner kernels and gradient checkpointing.' },
  { path: 'hyperparameters.offload_checkpoints', label: 'Offload checkpoints to host memory', section: 'training', advanced: true, methods: ADAPTER_METHODS,
    help: 'Each layer’s checkpointed input waits in host memory, copied while the GPU computes: the smallest footprint, about as fast. Off: only when the memory budget needs it. GPU only.' },
  { path: 'hyperparameters.save_steps', label: 'Checkpoint every', section: 'training', advanced: true,
    help: 'Steps between checkpoints, which a retry can resume from.' },
  { path: 'hyperparameters.seed', label: 'Seed', section: 'training', advanced: true,
    help: 'Makes the shuffle and initialisation repeatable.' },
  { path: 'grpo.load_in_4bit', label: 'Base in 4-bit (QLoRA)', section: 'grpo', advanced: true,
    help: 'Keeps the base model’s weights in 4-bit NF4 under the adapter: about a third of the memory. Needs a GPU.' },
  { path: 'lora.dropout', label: 'LoRA dropout', section: 'lora', advanced: true,
    help: 'Randomly drops adapter inputs while training; 0.05 can help small datasets.' },
  { path: 'gpus', label: 'GPUs', section: 'run', advanced: true,
    help: '0 runs on a CPU worker (slow, fine for the built-in model). More than 1 is not scheduled yet.' },
  { path: 'requeue_on_worker_loss', label: 'Requeue if the worker is lost', section: 'run', advanced: true,
    help: 'When the machine running the job dies or loses contact, queue it again to resume from its newest checkpoint (from the start before the first) instead of failing it; a job that keeps losing its worker fails after a few tries.' },
  { path: 'priority', label: 'Priority', section: 'run', advanced: true,
    help: 'Higher runs first; above 0 is for admins.' },
]

function fieldType(path: string, type: string | undefined, choices: unknown[] | undefined): FieldType {
  if (choices) return 'select'
  if (type === 'integer') return 'int'
  if (type === 'number') return 'float'
  if (type === 'boolean') return 'bool'
  throw new Error(`the form has no input for ${path} (${type})`)
}

function withSchema(text: FieldText): FieldDef {
  const { schema, nullable } = specField(text.path)
  const def: FieldDef = {
    ...text,
    type: fieldType(text.path, schema.type, schema.enum),
    optional: nullable,
    initial: schema.default == null ? '' : String(schema.default),
  }
  if (schema.enum) def.options = schema.enum.map(String)
  if (schema.minimum != null) def.min = schema.minimum
  if (schema.exclusiveMinimum != null) Object.assign(def, { min: schema.exclusiveMinimum, minExclusive: true })
  if (schema.maximum != null) def.max = schema.maximum
  if (schema.exclusiveMaximum != null) Object.assign(def, { max: schema.exclusiveMaximum, maxExclusive: true })
  return def
}

export const FIELDS: FieldDef[] = FIELD_TEXTS.map(withSchema)

/** The projections LoRA adapts: names, or every linear projection of the decoder layers. */
export type TargetModules = string[] | 'all-linear'
export type TargetChoice = 'attention' | 'experts' | 'all'

/** The LoRA targets choice a mixture of experts' form offers, as the spec's target_modules (lanner.core.spec). */
export const TARGET_CHOICES = specExtension('lora.target_modules', 'x-target-choices') as Record<TargetChoice, TargetModules>

export const TARGET_CHOICE_TEXTS: { value: TargetChoice; label: string }[] = [
  { value: 'attention', label: 'Attention only (q, k, v, o)' },
  { value: 'experts', label: 'Experts (gate, up, down)' },
  { value: 'all', label: 'All: attention and experts' },
]

/** The choice whose target_modules these are (in any order); null for another list (e.g. from a YAML file). */
export function targetChoice(targets: TargetModules): TargetChoice | null {
  const key = (t: TargetModules) => (typeof t === 'string' ? t : [...t].sort().join(','))
  return (Object.keys(TARGET_CHOICES) as TargetChoice[]).find((c) => key(TARGET_CHOICES[c]) === key(targets)) ?? null
}

/** Whether the form shows the LoRA targets choice: for an adapter of a mixture of experts (experts: from the
 * memory estimate, null while unknown), or whenever the targets are not the default, so none stay hidden. */
export function showsTargetChoice(form: JobForm, experts: number | null): boolean {
  return LORA_METHODS.includes(form.method) && (!!experts || targetChoice(form.targetModules) !== 'all')
}

export type PresetName = 'quick' | 'balanced' | 'thorough' | 'custom'

const PRESET_TEXTS: Record<Exclude<PresetName, 'custom'>, { label: string; help: string }> = {
  quick: { label: 'Quick', help: '1 epoch, short sequences: a first look in minutes.' },
  balanced: { label: 'Balanced', help: '3 epochs, effective batch 16: a solid default.' },
  thorough: { label: 'Thorough', help: '5 epochs, effective batch 64, long sequences, more warmup.' },
}
const PRESET_VALUES = specExtension('preset', 'x-presets')

/** The API's presets, over the defaults of the other fields. */
export const PRESETS = Object.fromEntries(Object.entries(PRESET_TEXTS).map(([name, text]) => {
  const values = Object.entries(PRESET_VALUES[name] ?? {}).map(([key, value]) => [`hyperparameters.${key}`, String(value)])
  return [name, { ...text, values: Object.fromEntries(values) as Record<string, string> }]
})) as Record<Exclude<PresetName, 'custom'>, { label: string; help: string; values: Record<string, string> }>

export interface JobForm {
  method: Method
  /** GRPO's reward functions. */
  rewardFunctions: RewardFunction[]
  /** builtin/…, a hub id, or an absolute path. */
  model: string
  datasetId: string
  name: string
  preset: PresetName
  values: Record<string, string>
  /** The experiment trackers the run logs to. */
  trackers: Tracker[]
  /** The LoRA targets (lora.target_modules). */
  targetModules: TargetModules
}

export const DEFAULT_VALUES: Record<string, string> = Object.fromEntries(FIELDS.map((f) => [f.path, f.initial]))

export function newJobForm(model: string, gpus = 1): JobForm {
  return {
    method: 'lora',
    rewardFunctions: [{ kind: 'exact_match' }],
    model,
    datasetId: '',
    name: '',
    preset: 'balanced',
    values: { ...DEFAULT_VALUES, ...PRESETS.balanced.values, gpus: String(gpus) },
    trackers: [],
    targetModules: TARGET_CHOICES.all,
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
  if (field.section === 'lora') return LORA_METHODS.includes(method)
  if (field.section === 'grpo') return RL_METHODS.includes(method)
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
  if (form.values['hyperparameters.packing'] === 'true' && PAIR_METHODS.includes(form.method))
    errors['hyperparameters.packing'] = `Packing does not apply to ${form.method}: preference pairs are never packed.`
  const engineNeeds = form.values['hyperparameters.use_kernels'] !== 'true' ? 'Lanner kernels'
    : form.values['hyperparameters.gradient_checkpointing'] !== 'true' ? 'gradient checkpointing' : null
  if (engineNeeds && ADAPTER_METHODS.includes(form.method)) {
    const budget = 'hyperparameters.memory_budget_gib', offload = 'hyperparameters.offload_checkpoints'
    if (form.values[budget]?.trim() && !errors[budget]) errors[budget] = `The memory budget needs ${engineNeeds} on.`
    if (form.values[offload] === 'true') errors[offload] = `Offloading checkpoints needs ${engineNeeds} on.`
  }
  if (RL_METHODS.includes(form.method)) {
    if (form.rewardFunctions.length === 0) errors['grpo.reward_functions'] = 'Add a reward function.'
    else if (form.rewardFunctions.some((f) => f.kind === 'reward_model' && f.job_id == null))
      errors['grpo.reward_functions'] = 'Choose the reward job of each trained reward model.'
    const group = Number(form.values['grpo.num_generations'])
    const batch = Number(form.values['hyperparameters.batch_size']) * Number(form.values['hyperparameters.gradient_accumulation'])
    if (!errors['grpo.num_generations'] && group > 0 && batch > 0 && batch % group !== 0)
      errors['grpo.num_generations'] = `Batch size × accumulation (${batch}) must be a multiple of the group size.`
    if (form.values['grpo.load_in_4bit'] === 'true' && form.values.gpus?.trim() === '0')
      errors.gpus = 'A base in 4-bit needs a GPU: set GPUs to 1, or turn it off.'
  }
  if (form.method === 'qlora' && form.values.gpus?.trim() === '0')
    errors.gpus = 'QLoRA needs a GPU (4-bit weights): set GPUs to 1, or use LoRA.'
  if (form.method === 'lora_fp8' && form.values.gpus?.trim() === '0')
    errors.gpus = 'LoRA on an FP8 base needs a GPU with FP8 (Ada or Hopper): set GPUs to 1, or use LoRA.'
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
  const grpo: Record<string, unknown> = {}
  const spec: Record<string, unknown> = {
    method: form.method,
    model: form.model.trim(),
    dataset_id: Number(form.datasetId),
  }
  if (form.name.trim()) spec.name = form.name.trim()
  if (form.preset !== 'custom') spec.preset = form.preset
  if (form.trackers.length) spec.trackers = form.trackers
  for (const field of FIELDS) {
    if (!fieldApplies(field, form.method)) continue
    const value = parsed(field, form.values[field.path] ?? '')
    if (value === null) continue
    const [group, key] = field.path.includes('.') ? field.path.split('.') : [null, field.path]
    if (group === 'hyperparameters') hyperparameters[key!] = value
    else if (group === 'lora') lora[key!] = value
    else if (group === 'preference') preference[key!] = value
    else if (group === 'grpo') grpo[key!] = value
    else spec[key!] = value
  }
  spec.hyperparameters = hyperparameters
  if (targetChoice(form.targetModules) !== 'all') lora.target_modules = form.targetModules
  if (LORA_METHODS.includes(form.method)) spec.lora = lora
  if (PREFERENCE_METHODS.includes(form.method)) spec.preference = preference
  if (RL_METHODS.includes(form.method)) spec.grpo = { ...grpo, reward_functions: form.rewardFunctions }
  return spec
}

/** A form filled from an existing job's config (Clone). */
export function formFromConfig(config: Record<string, unknown>, fallbackModel: string, copy = true): JobForm {
  const method = (typeof config.method === 'string' ? config.method : 'lora') as Method
  const values: Record<string, string> = { ...DEFAULT_VALUES }
  for (const field of FIELDS) {
    const [group, key] = field.path.includes('.') ? field.path.split('.') : [null, field.path]
    const source = group ? (config[group] as Record<string, unknown> | null | undefined) : config
    const value = source?.[key!]
    if (value === undefined || value === null) continue
    values[field.path] = String(value)
  }
  const grpo = config.grpo as { reward_functions?: RewardFunction[] } | null | undefined
  const lora = config.lora as { target_modules?: TargetModules } | null | undefined
  return {
    method,
    rewardFunctions: grpo?.reward_functions ?? [{ kind: 'exact_match' }],
    model: typeof config.model === 'string' ? config.model : fallbackModel,
    datasetId: config.dataset_id != null ? String(config.dataset_id) : '',
    name: typeof config.name === 'string' ? (copy ? `${config.name} (copy)` : config.name).slice(0, 200) : '',
    preset: 'custom',
    values,
    trackers: Array.isArray(config.trackers) ? (config.trackers as Tracker[]) : [],
    targetModules: lora?.target_modules ?? TARGET_CHOICES.all,
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
