// The backend's JSON, by the names the UI uses: each is a schema of the API's OpenAPI document
// (frontend/openapi.json), whose TypeScript types `./lanner api-types` generates into api/schema.d.ts.
import type { components } from './api/schema'

type Schemas = components['schemas']

/** GET /api/health. */
export type Health = Schemas['Health']
/** One dependency of the backend (database, Redis); its URL comes with any password redacted. */
export type ServiceHealth = Schemas['PartHealth']
/** A worker that answered the last health ping, with its device. */
export type WorkerInfo = Schemas['WorkerRecord']
export type WorkerDevice = Schemas['Device']
/** Whether llama.cpp (GGUF k-quants, GGUF checks, CPU chat) is ready: `./lanner up` builds it in the background. */
export type LlamaCppStatus = Schemas['LlamaCppStatus']

// ---- Accounts -------------------------------------------------------------

export type User = Schemas['UserOut']
/** GET /api/setup: whether the first admin is still to be created. */
export type SetupState = Schemas['SetupState']
export type ApiToken = Schemas['TokenOut']
/** POST /api/tokens answers with the token itself, once. */
export type CreatedToken = Schemas['CreatedToken']
/** Notifications: a webhook (its secret only in the creation's answer), its deliveries, the e-mail opt-in. */
export type Webhook = Schemas['WebhookOut']
export type CreatedWebhook = Schemas['CreatedWebhook']
export type WebhookEvent = Schemas['JobEvent']
export type Delivery = Schemas['DeliveryOut']
export type EmailNotifications = Schemas['EmailNotificationsOut']

// ---- Jobs -----------------------------------------------------------------

export type Job = Schemas['JobOut']
export type JobStatus = Schemas['JobStatus']
export type JobPage = Schemas['JobPage']
/** POST /api/jobs/config/parse: a YAML file read as a spec (Lanner's, Axolotl's, LLaMA-Factory's). */
export type ParsedConfig = Schemas['ParsedConfig']
export type QueueSnapshot = Schemas['QueueOut']
export type Method = Schemas['JobCreate']['method']
/** POST /api/sweeps, GET /api/sweeps/{id}: a search over some fields of one spec, each run a job. */
export type SweepCreate = Schemas['SweepCreate']
export type Sweep = Schemas['SweepOut']
export type SweepPage = Schemas['SweepPage']
/** GET /api/sweeps/{id}/ranking: the runs best first, the best succeeded run marked. */
export type SweepRanking = Schemas['SweepRanking']
export type RankedRun = Schemas['RankedRun']
/** An experiment tracker a job may log to (the spec's `trackers`). */
export type Tracker = Schemas['TrackerOption']['name']
/** GET /api/trackers: whether the studio offers it, and where its runs go. */
export type TrackerOption = Schemas['TrackerOption']
/** GET /api/jobs/{id}/trackers: a job's run in one tracker. */
export type TrackerRun = Schemas['TrackerRun']

// ---- Datasets, models, artifacts -----------------------------------------

export type Dataset = Schemas['DatasetOut']
export type DatasetPage = Schemas['DatasetPage']
export type DatasetReport = Schemas['DatasetReport']
export type CatalogModel = Schemas['CatalogModel']
export type Catalog = Schemas['Catalog']
export type Artifact = Schemas['ArtifactOut']

// ---- History, estimates, previews, exports -------------------------------

/** GET /api/jobs/{id}/metrics: one saved step (eval rows carry only eval_* values). */
export type MetricRow = Schemas['MetricOut']
/** GET /api/jobs/{id}/device-samples: one saved device sample. */
export type SampleRow = Schemas['SampleOut']
/** POST /api/jobs/estimate: bytes by part and total_bytes; null for a model of unknown size. */
export type MemoryEstimate = Schemas['MemoryEstimate']
/** GET /api/datasets/{id}/preview: rendered sequences, as segments trained or not. */
export type DatasetPreview = Schemas['DatasetPreview']
/** GET /api/datasets/{id}/token-stats. `lengths` (sorted) is there when the server sends it. */
export type TokenStats = Schemas['TokenStats']
/** GET /api/models/search: a model on the hub. */
export type HubModel = Schemas['HubModel']
/** The body of POST /api/jobs/{id}/export. */
export type ExportOptions = Schemas['ExportCreate']

// ---- A job's stream (/ws/jobs/{id}) ---------------------------------------

/** One entry: its stream id, its type, and the fields of the event that its publisher set. */
interface Entry<Type extends Schemas['JobEventType'], Data> {
  id: string
  type: Type
  data: Partial<Data>
}

/** What became of one format an export was asked for, with the figures its check judged (lanner.core.export_spec). */
export type FormatOutcome = Schemas['FormatOutcome']

/** The events of lanner.core.messages.records, one type of entry each. */
/** A GRPO reward function as the spec takes it (lanner.core.spec.RewardFunction). */
export type RewardFunction = Omit<Schemas['RewardFunction'], 'weight'> & { weight?: number }
/** POST /api/rewards/test: the functions tried on sample completions in the sandbox. */
export type RewardTestResult = Schemas['RewardTestResult']

/** GRPO: a few of a logged step's completions with their rewards. */
export type CompletionSamples = Schemas['CompletionSamples']

export type StreamEvent =
  | Entry<'metric', Schemas['StepMetrics']>
  | Entry<'device', Schemas['DeviceReading']>
  | Entry<'log', Schemas['LogLine']>
  | Entry<'status', Schemas['StatusChange']>
  | Entry<'cancel_requested', Schemas['CancelRequested']>
  | Entry<'dataset', Schemas['DatasetChecked']>
  | Entry<'checkpoint', Schemas['CheckpointSaved']>
  | Entry<'evaluation', Schemas['EvaluationResult']>
  | Entry<'progress', Schemas['ExportProgress']>
  | Entry<'verification', Schemas['ExportVerification']>
  | Entry<'completions', Schemas['CompletionSamples']>

// ---- Evaluation ------------------------------------------------------------

/** GET /api/jobs/{id}/evaluation: the trained model against its base on held-out prompts. */
export type Evaluation = Schemas['EvaluationOut']
export type EvaluationSample = Schemas['EvaluationSample']
