import { describe, expect, it } from 'vitest'
import { components } from '../openapi.json'
import {
  applyPreset, buildJobSpec, DEFAULT_LEARNING_RATE, DEFAULT_VALUES, estimatedSteps, FIELDS, formFromConfig, METHODS,
  newJobForm, PRESETS, showsTargetChoice, TARGET_CHOICES, targetChoice, validateJobForm, type JobForm,
} from './jobForm'

function form(values: Record<string, string> = {}, change: Partial<JobForm> = {}): JobForm {
  const base = newJobForm('builtin/SmolLM2-135M-Instruct', 0)
  return { ...base, datasetId: '3', ...change, values: { ...base.values, ...values } }
}

describe('validateJobForm', () => {
  it('accepts the defaults once a dataset is chosen', () => {
    expect(validateJobForm(form())).toEqual({})
  })

  it('asks for a model and a dataset', () => {
    expect(validateJobForm(form({}, { model: ' ', datasetId: '' }))).toEqual({
      model: 'Choose a model.',
      dataset_id: 'Choose or upload a dataset.',
    })
  })

  it('checks each number against the bounds the API checks', () => {
    const errors = validateJobForm(form({
      'hyperparameters.learning_rate': '0',
      'hyperparameters.epochs': 'abc',
      'hyperparameters.batch_size': '2.5',
      'hyperparameters.max_seq_len': '8',
      'hyperparameters.warmup_ratio': '1',
      'lora.rank': '',
    }))
    expect(errors['hyperparameters.learning_rate']).toBe('Must be more than 0.')
    expect(errors['hyperparameters.epochs']).toMatch(/Enter a number/)
    expect(errors['hyperparameters.batch_size']).toBe('Enter a whole number.')
    expect(errors['hyperparameters.max_seq_len']).toBe('Must be at least 16.')
    expect(errors['hyperparameters.warmup_ratio']).toBe('Must be less than 1.')
    expect(errors['lora.rank']).toBe('Enter a value.')
  })

  it('allows empty optional fields and scientific notation', () => {
    expect(validateJobForm(form({ 'hyperparameters.learning_rate': '', 'hyperparameters.max_steps': '' }))).toEqual({})
    expect(validateJobForm(form({ 'hyperparameters.learning_rate': '2e-4' }))).toEqual({})
  })

  it('applies the rules that tie fields to the method', () => {
    expect(validateJobForm(form({ 'hyperparameters.learning_rate': '0.01' }, { method: 'full' }))['hyperparameters.learning_rate']).toMatch(/at most 1e-3/)
    expect(validateJobForm(form({ 'hyperparameters.packing': 'true' }, { method: 'dpo' }))['hyperparameters.packing']).toMatch(/never packed/)
    expect(validateJobForm(form({ 'hyperparameters.packing': 'true' }, { method: 'reward' }))['hyperparameters.packing']).toMatch(/never packed/)
    expect(validateJobForm(form({}, { method: 'grpo', rewardFunctions: [{ kind: 'reward_model' }] }))['grpo.reward_functions'])
      .toBe('Choose the reward job of each trained reward model.')
    expect(validateJobForm(form({ gpus: '0' }, { method: 'qlora' })).gpus).toMatch(/needs a GPU/)
    expect(validateJobForm(form({ gpus: '0' }, { method: 'lora_fp8' })).gpus).toMatch(/needs a GPU with FP8/)
    expect(validateJobForm(form({ gpus: '1' }, { method: 'lora_fp8' })).gpus).toBeUndefined()
    // LoRA fields do not count for a full fine-tune.
    expect(validateJobForm(form({ 'lora.rank': '' }, { method: 'full' }))).toEqual({})
  })

  it('asks for the kernels and checkpointing when the memory engine is used, on adapter methods only', () => {
    expect(validateJobForm(form({ 'hyperparameters.memory_budget_gib': '60', 'hyperparameters.offload_checkpoints': 'true' }))).toEqual({})
    const noKernels = validateJobForm(form({ 'hyperparameters.memory_budget_gib': '60', 'hyperparameters.offload_checkpoints': 'true', 'hyperparameters.use_kernels': 'false' }))
    expect(noKernels['hyperparameters.memory_budget_gib']).toBe('The memory budget needs Lanner kernels on.')
    expect(noKernels['hyperparameters.offload_checkpoints']).toBe('Offloading checkpoints needs Lanner kernels on.')
    const noCheckpointing = validateJobForm(form({ 'hyperparameters.offload_checkpoints': 'true', 'hyperparameters.gradient_checkpointing': 'false', gpus: '1' }, { method: 'qlora' }))
    expect(noCheckpointing).toEqual({ 'hyperparameters.offload_checkpoints': 'Offloading checkpoints needs gradient checkpointing on.' })
    expect(validateJobForm(form({ 'hyperparameters.memory_budget_gib': '0' }))['hyperparameters.memory_budget_gib']).toBe('Must be more than 0.')
    // A full fine-tune has no memory engine: its stale values count for nothing.
    expect(validateJobForm(form({ 'hyperparameters.memory_budget_gib': '0', 'hyperparameters.use_kernels': 'false' }, { method: 'full' }))).toEqual({})
  })

  it('accepts absolute paths and hub ids but not relative paths', () => {
    expect(validateJobForm(form({}, { model: '/srv/models/x' }))).toEqual({})
    expect(validateJobForm(form({}, { model: 'Qwen/Qwen2.5-0.5B' }))).toEqual({})
    expect(validateJobForm(form({}, { model: 'models/x/y' })).model).toMatch(/absolute folder path/)
    expect(validateJobForm(form({}, { model: '/srv/../etc' })).model).toMatch(/“..”/)
  })
})

describe('buildJobSpec', () => {
  it('sends numbers as numbers, leaves out empty optionals, and only the sections of the method', () => {
    // An emptied field is left out too: the server fills in its default.
    const spec = buildJobSpec(form({ 'hyperparameters.max_steps': '5', 'hyperparameters.max_seq_len': '128', 'hyperparameters.save_steps': '' }))
    expect(spec).toMatchObject({
      method: 'lora',
      model: 'builtin/SmolLM2-135M-Instruct',
      dataset_id: 3,
      preset: 'balanced',
      gpus: 0,
      priority: 0,
      lora: { rank: 16, alpha: 32, dropout: 0 },
    })
    const hp = spec.hyperparameters as Record<string, unknown>
    expect(hp).toMatchObject({ max_steps: 5, max_seq_len: 128, gradient_checkpointing: true, packing: false, lr_scheduler: 'cosine', before_after_eval: true, use_kernels: true, oom_retry: true })
    expect((buildJobSpec(form({ 'hyperparameters.before_after_eval': 'false' })).hyperparameters as Record<string, unknown>).before_after_eval).toBe(false)
    expect('learning_rate' in hp).toBe(false)
    expect('save_steps' in hp).toBe(false)
    expect('preference' in spec).toBe(false)

    expect('memory_budget_gib' in hp).toBe(false)
    expect(hp.offload_checkpoints).toBe(false)
    const engine = buildJobSpec(form({ 'hyperparameters.memory_budget_gib': '19.5', 'hyperparameters.offload_checkpoints': 'true', 'hyperparameters.packing': 'true' }))
    expect(engine.hyperparameters).toMatchObject({ memory_budget_gib: 19.5, offload_checkpoints: true, packing: true })

    const dpo = buildJobSpec(form({}, { method: 'dpo' }))
    expect('offload_checkpoints' in (dpo.hyperparameters as Record<string, unknown>)).toBe(false)
    expect(dpo.preference).toEqual({ beta: 0.1 })
    expect('lora' in dpo).toBe(false)

    const reward = buildJobSpec(form({}, { method: 'reward' }))
    expect(reward.lora).toEqual({ rank: 16, alpha: 32, dropout: 0 })
    expect('preference' in reward || 'grpo' in reward).toBe(false)
  })
})

describe('presets and clones', () => {
  it('a preset fills its values and keeps the rest', () => {
    const quick = applyPreset(form({ 'hyperparameters.seed': '7' }), 'quick')
    expect(quick.values['hyperparameters.epochs']).toBe('1')
    expect(quick.values['hyperparameters.gradient_accumulation']).toBe('1')
    expect(quick.values['hyperparameters.seed']).toBe('7')
  })

  it('a clone starts from the job’s config', () => {
    const cloned = formFromConfig({
      method: 'lora', model: 'builtin/SmolLM2-135M-Instruct', dataset_id: 9, name: 'first',
      hyperparameters: { learning_rate: 0.0001, max_steps: 4, epochs: 3, memory_budget_gib: 40, offload_checkpoints: true },
      lora: { rank: 8 }, gpus: 0,
    }, 'x')
    expect(cloned.values['hyperparameters.memory_budget_gib']).toBe('40')
    expect(cloned.values['hyperparameters.offload_checkpoints']).toBe('true')
    expect(cloned.datasetId).toBe('9')
    expect(cloned.name).toBe('first (copy)')
    expect(cloned.values['hyperparameters.learning_rate']).toBe('0.0001')
    expect(cloned.values['lora.rank']).toBe('8')
    expect(cloned.values.gpus).toBe('0')
    expect(cloned.trackers).toEqual([])
    expect(validateJobForm(cloned)).toEqual({})
  })

  it('sends the chosen trackers, and a clone keeps them', () => {
    expect(buildJobSpec(form())).not.toHaveProperty('trackers')
    const spec = buildJobSpec(form({}, { trackers: ['mlflow', 'wandb'] }))
    expect(spec.trackers).toEqual(['mlflow', 'wandb'])
    expect(formFromConfig(spec, 'x').trackers).toEqual(['mlflow', 'wandb'])
  })

  it('estimates the steps from the rows, batch and epochs, or takes max steps', () => {
    const f = form({ 'hyperparameters.batch_size': '4', 'hyperparameters.gradient_accumulation': '2', 'hyperparameters.epochs': '2' })
    expect(estimatedSteps(f, 20)).toBe(6)
    expect(estimatedSteps({ ...f, values: { ...f.values, 'hyperparameters.max_steps': '5' } }, 20)).toBe(5)
    expect(estimatedSteps(f, null)).toBeNull()
  })
})

describe('bounds and defaults from the API', () => {
  const hyperparameters = components.schemas.Hyperparameters.properties
  const field = (path: string) => FIELDS.find((f) => f.path === path)!

  it('a field has the bounds, default and choices of the API’s schema', () => {
    expect(field('hyperparameters.max_seq_len')).toMatchObject({
      type: 'int', min: hyperparameters.max_seq_len.minimum, max: hyperparameters.max_seq_len.maximum, optional: false,
    })
    expect(field('hyperparameters.warmup_ratio')).toMatchObject({ max: hyperparameters.warmup_ratio.exclusiveMaximum, maxExclusive: true })
    expect(field('lora.alpha')).toMatchObject({ min: components.schemas.LoraSettings.properties.alpha.exclusiveMinimum, minExclusive: true })
    expect(field('hyperparameters.learning_rate')).toMatchObject({ type: 'float', optional: true, initial: '' })
    expect(field('hyperparameters.lr_scheduler').options).toEqual(hyperparameters.lr_scheduler.enum)
    expect(DEFAULT_VALUES['hyperparameters.seed']).toBe(String(hyperparameters.seed.default))
    expect(DEFAULT_VALUES.gpus).toBe(String(components.schemas.JobCreate.properties.gpus.default))
  })

  it('takes the learning rate of each method and the presets from the API', () => {
    expect(DEFAULT_LEARNING_RATE).toEqual(hyperparameters.learning_rate['x-default-by-method'])
    expect(DEFAULT_LEARNING_RATE.full).toBeLessThan(DEFAULT_LEARNING_RATE.lora)
    const thorough = components.schemas.JobCreate.properties.preset['x-presets'].thorough
    expect(PRESETS.thorough.values['hyperparameters.max_seq_len']).toBe(String(thorough.max_seq_len))
    expect(Object.keys(PRESETS.thorough.values)).toHaveLength(Object.keys(thorough).length)
  })

  it('offers every method the API takes', () => {
    expect(METHODS.map((m) => m.value).sort()).toEqual([...components.schemas.JobCreate.properties.method.enum].sort())
  })
})

describe('GRPO in the form', () => {
  const grpo = (values: Record<string, string> = {}, change: Partial<JobForm> = {}) =>
    form({ 'hyperparameters.batch_size': '4', 'hyperparameters.gradient_accumulation': '1', ...values },
      { method: 'grpo', ...change })

  it('sends the grpo section with its reward functions, and LoRA settings', () => {
    const functions = [{ kind: 'regex' as const, pattern: '^\\d+$', weight: 2 }]
    const spec = buildJobSpec(grpo({ 'grpo.num_generations': '2' }, { rewardFunctions: functions }))
    expect(spec.grpo).toMatchObject({ num_generations: 2, max_completion_len: 256, beta: 0.04, reward_functions: functions })
    expect(spec.lora).toMatchObject({ rank: 16 })
    expect(spec.preference).toBeUndefined()
    expect(buildJobSpec(form()).grpo).toBeUndefined()
  })

  it('asks for a reward function and whole groups per step', () => {
    expect(validateJobForm(grpo({ 'grpo.num_generations': '3' }, { rewardFunctions: [] }))).toEqual({
      'grpo.reward_functions': 'Add a reward function.',
      'grpo.num_generations': 'Batch size × accumulation (4) must be a multiple of the group size.',
    })
  })

  it('asks for a GPU for a 4-bit base', () => {
    expect(validateJobForm(grpo({ 'grpo.load_in_4bit': 'true', gpus: '0' }))).toEqual({
      gpus: 'A base in 4-bit needs a GPU: set GPUs to 1, or turn it off.',
    })
    expect(buildJobSpec(grpo({ 'grpo.load_in_4bit': 'true', gpus: '1' })).grpo).toMatchObject({ load_in_4bit: true })
  })

  it('a clone keeps the reward functions', () => {
    const functions = [{ kind: 'python' as const, source: 'def reward(p, c):\n    return [0.0] * len(c)\n' }]
    expect(formFromConfig({ method: 'grpo', grpo: { reward_functions: functions } }, 'm').rewardFunctions).toEqual(functions)
  })
})

describe('LoRA targets choice', () => {
  it('comes from the API as target_modules: attention, experts, all', () => {
    expect(TARGET_CHOICES).toEqual({ attention: ['q_proj', 'k_proj', 'v_proj', 'o_proj'], experts: ['gate_proj', 'up_proj', 'down_proj'], all: 'all-linear' })
  })

  it('goes into the spec’s lora.target_modules, and all (the default) leaves it to the server', () => {
    expect(buildJobSpec(form({}, { targetModules: TARGET_CHOICES.experts })).lora).toMatchObject({ target_modules: ['gate_proj', 'up_proj', 'down_proj'] })
    expect(buildJobSpec(form({}, { targetModules: TARGET_CHOICES.attention })).lora).toMatchObject({ target_modules: ['q_proj', 'k_proj', 'v_proj', 'o_proj'] })
    expect(buildJobSpec(form()).lora).not.toHaveProperty('target_modules')
    expect(buildJobSpec(form({}, { method: 'full', targetModules: TARGET_CHOICES.experts }))).not.toHaveProperty('lora')
  })

  it('is shown for an adapter of a mixture of experts, or when the targets are not the default', () => {
    expect(showsTargetChoice(form(), 8)).toBe(true)
    expect(showsTargetChoice(form(), 0)).toBe(false)
    expect(showsTargetChoice(form(), null)).toBe(false)
    expect(showsTargetChoice(form({}, { method: 'full' }), 8)).toBe(false)
    expect(showsTargetChoice(form({}, { targetModules: ['q_proj', 'v_proj'] }), 0)).toBe(true)
  })

  it('a clone keeps the job’s targets, a choice or a list of its own', () => {
    const experts = formFromConfig({ method: 'lora', lora: { target_modules: ['down_proj', 'gate_proj', 'up_proj'] } }, 'm')
    expect(targetChoice(experts.targetModules)).toBe('experts')
    const own = formFromConfig({ method: 'lora', lora: { target_modules: ['q_proj', 'v_proj'] } }, 'm')
    expect(targetChoice(own.targetModules)).toBeNull()
    expect(buildJobSpec({ ...own, datasetId: '1' }).lora).toMatchObject({ target_modules: ['q_proj', 'v_proj'] })
    expect(targetChoice(formFromConfig({ method: 'lora' }, 'm').targetModules)).toBe('all')
  })
})
