import { describe, expect, it } from 'vitest'
import { sessionOpen, sessionText } from './gpuSession'
import type { GpuSession } from './types'

describe('GPU session in words', () => {
  it('says where it is in the queue, where it runs, and why it ended', () => {
    const session: GpuSession = { id: 4, status: 'queued', queue_position: 2, device: null, error: null }
    expect(sessionText(session)).toContain('Waiting for a GPU: number 2 in the queue (job 4)')
    expect(sessionText({ ...session, queue_position: null })).toContain('Waiting for a GPU: in the queue')
    expect(sessionText({ ...session, status: 'running', device: { name: 'NVIDIA H200' } })).toBe(
      'GPU session running on NVIDIA H200 (job 4).',
    )
    const failed: GpuSession = { ...session, status: 'failed', error: 'GPU chat failed: out of memory' }
    expect(sessionText(failed)).toBe('The GPU session (job 4) has ended (failed): GPU chat failed: out of memory.')
    expect(sessionOpen(session)).toBe(true)
    expect(sessionOpen(failed)).toBe(false)
    expect(sessionOpen(null)).toBe(false)
  })
})
