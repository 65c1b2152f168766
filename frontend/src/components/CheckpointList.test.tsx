import { render, screen } from '@testing-library/react'
import { MemoryRouter } from 'react-router'
import { describe, expect, it } from 'vitest'
import type { Artifact, Job } from '../types'
import { CheckpointList } from './CheckpointList'

const checkpoint = (id: number, name: string): Artifact => ({
  id, job_id: 7, kind: 'checkpoint', name, size_bytes: 4096, verification: null,
  created_at: '2026-12-02T12:00:00Z', files: ['adapter_model.safetensors', 'trainer_state.json'],
})

describe('CheckpointList', () => {
  it('offers each checkpoint folder whole as a tar stream', () => {
    const job = { id: 7, status: 'succeeded' } as Job
    render(<MemoryRouter><CheckpointList job={job} checkpoints={[checkpoint(5, 'checkpoint-20'), checkpoint(6, 'checkpoint-40')]}
      canManage={false} /></MemoryRouter>)
    expect(screen.getByRole('link', { name: /^Download \(\.tar\)\s*checkpoint-40/ }))
      .toHaveAttribute('href', '/api/artifacts/6/download?archive=tar')
    expect(screen.getAllByRole('link', { name: /\.tar/ })).toHaveLength(2)
  })
})
