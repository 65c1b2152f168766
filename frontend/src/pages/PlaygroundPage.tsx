import { useCallback, useState, type FormEvent } from 'react'
import { Link, useSearchParams } from 'react-router'
import { postJson } from '../api'
import { EmptyState } from '../components/EmptyState'
import { ErrorNotice, Field, errorText } from '../components/Field'
import { LlamaCppNotice } from '../components/LlamaCppNotice'
import { PageHeader } from '../components/PageHeader'
import { llamaCppWaiting, useHealth } from '../health'
import { ChatColumn } from '../playground/ChatColumn'
import { ask, busy, emptyChat, history, receive, type Chat } from '../playground/conversation'
import { sessionOpen, sessionText, useGpuSession } from '../playground/gpuSession'
import { SamplingForm } from '../playground/SamplingForm'
import type { ModelFile, PlaygroundJob, Sampling, ServerMessage, Side, Where } from '../playground/types'
import { usePlaygroundSocket } from '../playground/usePlaygroundSocket'
import type { Job } from '../types'
import { useResource } from '../useResource'
import '../playground/playground.css'

type Mode = 'tuned' | 'base' | 'both'
const MODES: { value: Mode; label: string }[] = [
  { value: 'tuned', label: 'Fine-tuned' },
  { value: 'base', label: 'Base model' },
  { value: 'both', label: 'Side by side' },
]
const PLACES: { value: Where; label: string }[] = [
  { value: 'cpu', label: 'CPU (GGUF, llama.cpp)' },
  { value: 'gpu', label: 'Run on GPU (queued)' },
]
const DEFAULT_SAMPLING: Sampling = { temperature: 0.7, top_p: 0.95, max_tokens: 256, stop: [] }

function sidesOf(mode: Mode): Side[] {
  return mode === 'both' ? ['base', 'tuned'] : [mode]
}

interface ChoicesProps<T extends string> {
  legend: string
  name: string
  options: { value: T; label: string }[]
  value: T
  disabled: boolean
  onChange: (value: T) => void
}

/** One radio button per option, in a fieldset whose legend only screen readers read. */
function Choices<T extends string>({ legend, name, options, value, disabled, onChange }: ChoicesProps<T>) {
  return (
    <fieldset className="playground-sides">
      <legend className="visually-hidden">{legend}</legend>
      {options.map((item) => (
        <label key={item.value} className="field--check">
          <input type="radio" name={name} value={item.value} checked={value === item.value} disabled={disabled}
            onChange={() => onChange(item.value)} />{' '}
          {item.label}
        </label>
      ))}
    </fieldset>
  )
}

function ModelAvailability({ label, file, testId }: { label: string; file: ModelFile; testId: string }) {
  return (
    <p data-testid={testId}>
      <strong>{label}:</strong>{' '}
      {file.available ? <span className="mono">{file.gguf}</span> : <span className="error-text">{file.reason}</span>}
    </p>
  )
}

function ExportButton({ job, onQueued }: { job: PlaygroundJob; onQueued: () => void }) {
  const [queued, setQueued] = useState<number | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [sending, setSending] = useState(false)
  if (job.pending_export) {
    return (
      <p className="muted">
        Export <Link to={`/jobs/${job.pending_export.job_id}`}>job {job.pending_export.job_id}</Link> is{' '}
        {job.pending_export.status}.
      </p>
    )
  }
  if (queued != null) {
    return (
      <p className="muted">
        Export queued as <Link to={`/jobs/${queued}`}>job {queued}</Link>; chat with the fine-tuned model when it is done.
      </p>
    )
  }
  const start = async () => {
    setSending(true)
    setError(null)
    try {
      const created = await postJson<Job>(job.export_url, { gguf_types: ['q8_0'] })
      setQueued(created.id)
      onQueued()
    } catch (err) {
      setError(errorText(err))
    } finally {
      setSending(false)
    }
  }
  return (
    <div>
      <button type="button" className="button" onClick={start} disabled={sending}>
        Export a GGUF (q8_0)
      </button>
      <ErrorNotice error={error} />
    </div>
  )
}

export function PlaygroundPage() {
  const jobs = useResource<PlaygroundJob[]>('/api/playground/jobs')
  const health = useHealth()
  const [params, setParams] = useSearchParams()
  const [mode, setMode] = useState<Mode>('tuned')
  const [chat, setChat] = useState<Chat>(emptyChat)
  const [problem, setProblem] = useState<string | null>(null)
  const [question, setQuestion] = useState('')
  const [system, setSystem] = useState('')
  const [sampling, setSampling] = useState<Sampling>(DEFAULT_SAMPLING)
  const [where, setWhere] = useState<Where>('cpu')
  const gpu = useGpuSession()

  const onMessage = useCallback((message: ServerMessage) => {
    if (message.type === 'error' && message.model == null) setProblem(message.message)
    setChat((current) => receive(current, message))
  }, [])
  const socket = usePlaygroundSocket(onMessage)

  const list = jobs.data ?? []
  const chosenId = Number(params.get('job')) || list[0]?.job_id
  const job = list.find((item) => item.job_id === chosenId) ?? null
  const sides = sidesOf(mode)
  const answering = busy(chat)
  const onGpu = where === 'gpu'
  const missing = job && !onGpu ? sides.filter((side) => !job[side].available) : []
  const gpuReady = !onGpu || sessionOpen(gpu.session)
  const cpuReady = onGpu || llamaCppWaiting(health) === null

  const choose = (id: string) => {
    setParams(id ? { job: id } : {})
    setChat(emptyChat())
    setProblem(null)
    if (onGpu) {
      void gpu.close()
      setWhere('cpu')
    }
  }

  const place = (value: Where) => {
    setWhere(value)
    if (value === 'gpu' && job) void gpu.start(job.job_id)
    else void gpu.close() // a GPU held for nothing would keep the queue waiting
  }

  const send = (event: FormEvent) => {
    event.preventDefault()
    const text = question.trim()
    if (!job || !text || answering || !gpuReady || !cpuReady) return
    const next = ask(chat, sides, text)
    setChat(next)
    setProblem(null)
    setQuestion('')
    socket.send({
      type: 'generate',
      id: Date.now(),
      job_id: job.job_id,
      chats: Object.fromEntries(sides.map((side) => [side, history(next[side])])),
      system: system.trim() ? system : null,
      temperature: sampling.temperature,
      top_p: sampling.top_p,
      max_tokens: sampling.max_tokens,
      stop: sampling.stop.filter((stop) => stop.length > 0),
      ...(onGpu && gpu.session ? { gpu_session: gpu.session.id } : {}),
    })
  }

  return (
    <>
      <PageHeader
        title="Playground"
        description="Talk to a fine-tuned model and its base model, one at a time or side by side. By default it runs on the CPU from GGUF files, so it never takes a GPU from the queue; a GPU session waits in the queue like any job."
      />
      <ErrorNotice error={jobs.error} title="The finished jobs could not be loaded" />
      {jobs.data && list.length === 0 && (
        <EmptyState title="No finished fine-tune yet">
          <p>
            When a job has succeeded it appears here. <Link to="/jobs/new">Start a fine-tune</Link>.
          </p>
        </EmptyState>
      )}
      {job && (
        <>
          <div className="playground-toolbar">
            <Field label="Job">
              <select value={String(job.job_id)} onChange={(event) => choose(event.target.value)}>
                {list.map((item) => (
                  <option key={item.job_id} value={item.job_id}>
                    #{item.job_id} {item.name} ({item.model})
                  </option>
                ))}
              </select>
            </Field>
            <Choices legend="Who answers" name="mode" options={MODES} value={mode} disabled={answering} onChange={setMode} />
            <Choices legend="Where it runs" name="where" options={PLACES} value={where} disabled={answering} onChange={place} />
            <button type="button" className="button" disabled={answering} onClick={() => setChat(emptyChat())}>
              New chat
            </button>
          </div>
          {onGpu && (
            <div className="panel">
              <div className="panel__body">
                {gpu.session && <p data-testid="gpu-session">{sessionText(gpu.session)}</p>}
                {!gpu.session && !gpu.error && <p className="muted">Queueing a GPU session…</p>}
                <ErrorNotice error={gpu.error} title="No GPU session" />
                {sessionOpen(gpu.session) ? (
                  <button type="button" className="button button--danger" disabled={answering} onClick={() => place('cpu')}>
                    End GPU session
                  </button>
                ) : (
                  <button type="button" className="button" onClick={() => void gpu.start(job.job_id)}>
                    Start a GPU session
                  </button>
                )}
              </div>
            </div>
          )}
          <div className="panel">
            <div className="panel__body">
              <ModelAvailability label="Fine-tuned" file={job.tuned} testId="tuned-gguf" />
              <ModelAvailability label="Base model" file={job.base} testId="base-gguf" />
              {!job.tuned.available && job.tuned.code === 'not_exported' && (
                <ExportButton key={job.job_id} job={job} onQueued={() => void jobs.reload()} />
              )}
            </div>
          </div>
          {!onGpu && <LlamaCppNotice title="Chat on the CPU needs llama.cpp" meanwhile="A GPU session needs no llama.cpp." />}
          <ErrorNotice error={socket.closeReason} />
          <ErrorNotice error={problem} />
          <form className="playground-compose" onSubmit={send}>
            <label className="visually-hidden" htmlFor="playground-question">
              Your message
            </label>
            <textarea
              id="playground-question"
              rows={2}
              placeholder="Ask something…"
              value={question}
              onChange={(event) => setQuestion(event.target.value)}
              onKeyDown={(event) => {
                if (event.key === 'Enter' && !event.shiftKey) send(event)
              }}
            />
            <button
              type="submit"
              className="button button--primary"
              disabled={answering || missing.length > 0 || !gpuReady || !cpuReady || !question.trim()}
            >
              Send
            </button>
            <button type="button" className="button button--danger" disabled={!answering} onClick={() => socket.send({ type: 'stop' })}>
              Stop
            </button>
          </form>
          {missing.length > 0 && (
            <p className="muted">
              {missing.map((side) => (side === 'tuned' ? 'The fine-tuned model' : 'The base model')).join(' and ')} cannot
              answer yet (see above).
            </p>
          )}
          <div className={`playground-columns${sides.length === 2 ? ' playground-columns--two' : ''}`}>
            {sides.map((side) => (
              <ChatColumn
                key={side}
                side={side}
                state={chat[side]}
                source={onGpu ? `GPU session${gpu.session ? ` (job ${gpu.session.id})` : ''}` : (job[side].gguf ?? '')}
              />
            ))}
          </div>
          <SamplingForm system={system} onSystem={setSystem} sampling={sampling} onSampling={setSampling} />
        </>
      )}
    </>
  )
}
